"""Running a completion's code against a row's tests, for the ``code_tests`` built-in reward.

Two processes per completion, each ``code_sandbox`` (a folder run by path) in a sandbox of its own. The program's (P) runs the
completion's code, then answers calls on a pipe pair. The tests' (T) runs the row's tests, which it alone is
given (on its stdin), with the code's top-level names standing for P's objects: a call goes to P, plain data comes
back, and T compares it itself. T's verdict comes on T's stdout, which P never holds: a program that exits early,
patches its interpreter or returns an object equal to everything wins nothing, for it never judges.

Each sandbox, where this machine allows it (:func:`isolation` probes once and says what is missing, once): its own
user, network (none), PID (a fresh ``/proc``) and mount namespaces, made by ``unshare`` without privileges; every
mount read-only but its scratch directory, a tmpfs of :data:`SCRATCH_BYTES`, and no capability to undo that; no
process of its own (a seccomp filter: threads only); limits on memory, CPU time and file size; a wall-clock limit
(both process groups killed at it); and none of the job's environment (no tokens). It can still read what the job
can read.

Plain Python: the client imports this module with the built-in rewards.
"""

import contextlib
import dataclasses
import functools
import json
import logging
import os
import selectors
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Optional, Sequence

log = logging.getLogger("posttrain")

HARNESS = Path(__file__).with_name("code_sandbox")
# a user namespace (no privileges needed) for network (none), PID (a fresh /proc) and mount namespaces;
# --kill-child: killing unshare kills what it runs
UNSHARE = ("unshare", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc")
# what each bound keeps from the program, for the line that says which this machine lacks
BOUNDS: Dict[str, str] = {
    "namespaces": "the network, other processes (its tests' among them) and their /proc",
    "read_only": "writes outside its scratch directory",
    "scratch": "a disk fuller than its scratch directory's size",
    "processes": "processes of its own (a fork bomb)",
}
# the scratch directory's size, and the most a file may hold where there is no such directory
SCRATCH_BYTES = 16 * 2**20
# the end of the program's stderr kept with its sample (its traceback)
STDERR_BYTES = 4096
# the environment a program gets: none of the job's; one thread per numeric library (the CPUs are shared)
THREADS = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a completion's code did against its tests."""

    passed: bool
    # where the tests failed (their line, a timeout, ...); empty when they passed
    failure: str
    # the end of the program's stderr
    stderr: str

    def text(self) -> str:
        """What the sample keeps: the failure, then the program's stderr."""
        return "\n".join(part for part in (self.failure, self.stderr) if part)


@functools.lru_cache(maxsize=1)
def isolation() -> FrozenSet[str]:
    """The :data:`BOUNDS` this machine lets a program's sandbox hold, probed once; those it lacks said once."""
    held = _probe(UNSHARE) if shutil.which("unshare") else None
    held = held if held is not None else _probe(())
    held = held or frozenset()
    missing = [what for name, what in BOUNDS.items() if name not in held]
    # every rank probes; the job's first rank says it
    if missing and os.environ.get("RANK", "0") == "0":
        log.warning("code_tests: this machine does not keep completions' code from %s", "; ".join(missing))
    return held


def _probe(prefix: Sequence[str]) -> Optional[FrozenSet[str]]:
    """The bounds the harness can set under ``prefix``; None where it does not run. Mounts are tried in namespaces
    alone: outside them they would be the machine's."""
    asked = "read_only,scratch,processes" if prefix else "processes"
    with tempfile.TemporaryDirectory(prefix="posttrain-code-") as scratch:
        try:
            probe = subprocess.run(
                [*prefix, *_harness(), "probe", scratch, asked, "0", "0", "0"],
                capture_output=True,
                timeout=30,
                env=_environment(scratch),
            )
            held = json.loads(probe.stdout) if probe.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return None
    if not isinstance(held, list):
        return None
    return frozenset(held) | ({"namespaces"} if prefix else set())


def workers() -> int:
    """The programs this process runs at once: its share of the CPUs it may use, with the node's other ranks."""
    return max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def run(code: str, tests: Any, timeout_s: float, memory_mb: int) -> Outcome:
    """How ``code`` does against ``tests`` (Python source), each in its sandbox, within ``timeout_s`` seconds and
    ``memory_mb`` MiB each."""
    if not isinstance(tests, str):
        return Outcome(False, f"the tests are a {type(tests).__name__}; expected Python source, a string", "")
    held = isolation()
    prefix = UNSHARE if "namespaces" in held else ()
    bounds = ",".join(sorted(held - {"namespaces"}))
    limits = [str(memory_mb * 2**20), str(int(timeout_s) + 1), str(SCRATCH_BYTES)]
    with tempfile.TemporaryDirectory(prefix="posttrain-code-") as scratch:
        # requests from the tests to the program, answers back
        requests, answers = os.pipe(), os.pipe()
        roles = (
            ("program", (requests[0], answers[1]), subprocess.DEVNULL, subprocess.PIPE),
            ("tests", (requests[1], answers[0]), subprocess.PIPE, subprocess.DEVNULL),
        )
        processes: List[subprocess.Popen] = []
        try:
            try:
                for role, pipe_fds, stdout, stderr in roles:
                    directory = Path(scratch) / role
                    directory.mkdir()
                    command = [*prefix, *_harness(), role, str(directory), bounds, *limits]
                    processes.append(
                        subprocess.Popen(
                            [*command, *map(str, pipe_fds)],
                            cwd=directory,
                            env=_environment(str(directory)),
                            stdin=subprocess.PIPE,
                            stdout=stdout,
                            stderr=stderr,
                            pass_fds=pipe_fds,
                            start_new_session=True,
                        )
                    )
            finally:
                for fd in (*requests, *answers):
                    os.close(fd)
            program, tester = processes
            _send(program, code)
            _send(tester, tests)
            return _watch(program, tester, timeout_s)
        finally:
            for process in processes:
                _end_group(process)


def _harness() -> List[str]:
    """The command that starts the harness: without ``site``, which reads every ``.pth`` file of the environment
    (an editable install's took 11 of a start's 33 ms), and with the environment's packages on its path (numpy)."""
    return [sys.executable, "-I", "-S", str(HARNESS), os.pathsep.join(site.getsitepackages())]


def _environment(scratch: str) -> Dict[str, str]:
    return {"PATH": os.defpath, "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8", **THREADS}


def _send(process: subprocess.Popen, text: str) -> None:
    """``text`` on the process's stdin, closed after; a process already gone has failed on its own."""
    with contextlib.suppress(BrokenPipeError), process.stdin:
        process.stdin.write(text.encode("utf-8", "replace"))


def _watch(program: subprocess.Popen, tester: subprocess.Popen, timeout_s: float) -> Outcome:
    """The tests' verdict and the end of the program's stderr, read until the tests end or the time is up."""
    kept = {program.stderr: bytearray(), tester.stdout: bytearray()}
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        for stream in kept:
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return Outcome(False, f"timed out after {timeout_s:g} s", _tail(kept[program.stderr]))
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    if key.fileobj is tester.stdout:
                        # the tests are done: nothing the program does now counts
                        _kill_group(program)
                    continue
                kept[key.fileobj] += chunk
                if key.fileobj is program.stderr:
                    # one byte over the bound: the mark that it was cut
                    del kept[key.fileobj][: -(STDERR_BYTES + 1)]
    stderr = _tail(kept[program.stderr])
    try:
        verdict = json.loads(kept[tester.stdout])
    except ValueError:
        verdict = None
    if not isinstance(verdict, dict) or not isinstance(verdict.get("passed"), bool):
        return Outcome(False, f"the tests ended without a verdict (exit code {tester.wait()})", stderr)
    return Outcome(verdict["passed"], str(verdict.get("failure", "")), stderr)


def _tail(stderr: bytearray) -> str:
    text = stderr[-STDERR_BYTES:].decode("utf-8", "replace")
    return f"[...]{text}" if len(stderr) > STDERR_BYTES else text


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _end_group(process: subprocess.Popen) -> None:
    """Kills what is left of the process's session (its own group), and reaps it."""
    _kill_group(process)
    process.wait()
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def code_of(answer: str) -> str:
    """The code a completion's answer is tested as: its last fenced block, else the whole answer."""
    blocks = _fenced_blocks(answer)
    return blocks[-1] if blocks else answer


def _fenced_blocks(text: str) -> List[str]:
    """The contents of the Markdown code blocks (```python or ```) in ``text``, in order."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.strip().startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks
