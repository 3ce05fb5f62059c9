"""Running a completion's code against a row's tests, for the ``code_tests`` built-in reward.

Each program runs in a process of its own: a time limit (the whole process group killed at it), a memory limit
and a file-size limit, a scratch directory as its working directory, home and temporary directory (removed
after), no environment of the job's (no tokens), and, where the platform allows unprivileged namespaces
(``unshare``), no network and no process outliving it: a network namespace of its own with only a down loopback,
and a PID namespace whose every process ends with it. Where ``unshare`` cannot make them, the program runs without
those two, and :func:`isolation` says so once.

It guards against mistakes (a loop that never ends, a runaway allocation, a stray write, a call to a service),
not against hostile code: the program runs as the job's user, can read what the job can, and can write outside
its directory.

Plain Python: the client imports this module with the built-in rewards.
"""

import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Tuple

log = logging.getLogger("posttrain")

# Where unshare can make them: a user namespace (no privileges needed), a network namespace (a down loopback,
# nothing else), a PID namespace (the program its first process: the rest end with it); --kill-child: killing
# unshare kills the program
UNSHARE = ("unshare", "--map-root-user", "--net", "--pid", "--fork", "--kill-child")
# what a program may write in all (a runaway log or file fills no disk)
FILE_BYTES = 64 * 2**20
# The interpreter bounds itself, then runs the program as __main__: limits set as soft and hard, which an
# unprivileged process cannot raise again (no preexec_fn: rewards run programs from several threads)
BOOT = (
    "import resource, runpy, sys\n"
    "for limit, value in zip((resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_FSIZE), map(int, sys.argv[2:])):\n"
    "    resource.setrlimit(limit, (value, value))\n"
    "runpy.run_path(sys.argv[1], run_name='__main__')\n"
)


@functools.lru_cache(maxsize=1)
def isolation() -> Tuple[str, ...]:
    """The command that isolates a program from the network and keeps no process of it alive, where this machine
    allows it without privileges; else none (said once)."""
    if shutil.which("unshare") is not None:
        try:
            probe = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            probe = None
        if probe is not None and probe.returncode == 0:
            return UNSHARE
    log.warning(
        "code_tests: this machine does not let unshare make network and PID namespaces without privileges: "
        "completions' code runs with the job's network, and a process it leaves in the background may outlive it"
    )
    return ()


def passes(program: str, timeout_s: float, memory_mb: int) -> bool:
    """Whether ``program`` (Python source) exits 0 within the limits."""
    with tempfile.TemporaryDirectory(prefix="posttrain-code-") as scratch:
        path = Path(scratch) / "program.py"
        path.write_text(program)
        environment = {"PATH": os.defpath, "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8"}
        limits = [memory_mb * 2**20, int(timeout_s) + 1, FILE_BYTES]
        process = subprocess.Popen(
            [*isolation(), sys.executable, "-I", "-c", BOOT, str(path), *map(str, limits)],
            cwd=scratch,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            return process.wait(timeout=timeout_s) == 0
        except subprocess.TimeoutExpired:
            return False
        finally:
            _end_group(process)


def _end_group(process: subprocess.Popen) -> None:
    """Kills what is left of the program's session (its own group), and reaps it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def program_of(answer: str, tests: str) -> str:
    """The program a completion's answer is tested as: its code (the last fenced block, else the whole answer),
    then the tests."""
    blocks = _fenced_blocks(answer)
    code = blocks[-1] if blocks else answer
    return f"{code}\n\n{tests}\n"


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
