"""Where torchrun, torchx and posttrain's launcher look for how a process ended: torchelastic's error file, and the
marks a rank leaves its launcher.

torchrun gives each worker ``TORCHELASTIC_ERROR_FILE``, copies the root
cause's file up to its own (which torchx gives the replica), and torchx
reports that as the app's structured error (``AppStatus``, ``runner.wait()``,
``torchx status``). posttrain leaves its one line there. Standard library
only: the rendezvous port's check, before any launcher, uses it too.
"""

import contextlib
import hashlib
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Iterator, NoReturn, Optional

# A rank's exit codes: a check stopped it, and it said why (see runtime.run); it crashed (Python's own code)
STOPPED, CRASHED = 2, 1
# Set by posttrain's launcher (launcher.py), which says a crash's line once for the ranks that crashed
LAUNCHER_SAYS = "POSTTRAIN_LAUNCHER_SAYS"
# Set by posttrain's launcher: where it keeps the run's logs when the run ends (rank 0's first line names it)
KEPT_LOGS = "POSTTRAIN_KEPT_LOGS"
# where posttrain's launchers have each rank say it finished (report_done), or printed its last line (say)
DONE_DIR_ENV = "POSTTRAIN_RANKS_DONE_DIR"


def report_done() -> None:
    """Tells posttrain's launcher (torchrun's or DeepSpeed's) that this rank finished its run: a rank that ends with
    exit code 0 without it (``os._exit`` in user code) fails the job there."""
    _mark("rank")


def say(line: str) -> None:
    """Prints the line this rank stops with, and tells posttrain's launcher it did: where no rank of a node did (rank
    0 was stopped first), the launcher of rank 0's node says it (``launcher.unsaid_line``). A line another rank of
    the node said already is not printed again: a cause the ranks meet alike (a full disk they share) is one line."""
    if _first_to_say(line):
        print(line, file=sys.stderr, flush=True)
    _mark("said")


def _first_to_say(line: str) -> bool:
    """Whether no rank of this node has said ``line``: the first to make its mark in the launcher's directory."""
    done_dir = os.environ.get(DONE_DIR_ENV)
    if not done_dir:
        return True
    mark = Path(done_dir) / f"line-{hashlib.sha256(line.encode()).hexdigest()[:16]}"
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    except OSError:
        # no mark can be made: saying it twice is better than not at all
        return True
    return True


def _mark(kind: str) -> None:
    done_dir = os.environ.get(DONE_DIR_ENV)
    if done_dir:
        (Path(done_dir) / f"{kind}-{os.environ.get('RANK', '0')}").touch()


def record_error(message: str) -> None:
    """Leaves ``message`` as this process's failure, where the environment names a file for it."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        # no traceback: the line says it all
        extra = {"py_callstack": "", "timestamp": str(int(time.time()))}
        Path(path).write_text(json.dumps({"message": {"message": message, "extraInfo": extra}}))


def stop_now(line: str) -> NoReturn:
    """Ends this process at once, saying ``line`` (a ``posttrain:`` line) and leaving it in the error file (exit 2):
    for a thread that finds the job cannot go on while the main thread is where nothing interrupts it (a blocked
    collective, another run's directory)."""
    try:
        say(line)
        record_error(line)
    finally:
        # a closed stream or an unwritable file must not leave the process running
        os._exit(STOPPED)


@contextlib.contextmanager
def deadline(seconds: float, line: str) -> Iterator[None]:
    """Ends this process with ``line`` (:func:`stop_now`) unless the block ends within ``seconds``: for work that may
    block where nothing raises (a request without a timeout, a collective, a user's function), in any thread."""
    said = threading.Lock()

    def overdue() -> None:
        if said.acquire(blocking=False):
            stop_now(line)

    timer = threading.Timer(seconds, overdue)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        # blocks only while the timer ends the process
        said.acquire()


class Exit(SystemExit):
    """posttrain's own end of a process from within its work (a preemption's exit code): not user code's
    ``sys.exit``, which ``runtime.ends_in_one_line`` says as a failure."""


def posttrain_line(error_file_data: Any) -> Optional[str]:
    """The ``posttrain:`` line an error file holds, if it holds one."""
    message = error_file_data.get("message") if isinstance(error_file_data, dict) else None
    text = message.get("message") if isinstance(message, dict) else message
    return text if isinstance(text, str) and text.startswith("posttrain:") else None


def record_crash(error: BaseException, rank: int, traceback_dir: Optional[Path]) -> None:
    """Says a crash in one line, its traceback kept in ``traceback_dir`` (printed here where it cannot be written).

    The line names the exception and the innermost frame it came from; it is left in the error file, and printed
    unless posttrain's launcher says it (once, for every rank that crashed alike).
    """
    frame = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    where = f" (at {Path(frame.filename).name}:{frame.lineno} in {frame.name})" if frame else ""
    summary = traceback.format_exception_only(error)[-1].strip().splitlines()[0]
    full = "".join(traceback.format_exception(error))
    kept = None
    if traceback_dir is not None:
        try:
            traceback_dir.mkdir(parents=True, exist_ok=True)
            kept = traceback_dir / f"traceback-rank{rank}.txt"
            kept.write_text(full)
        except OSError:
            kept = None
    if kept is None:
        print(full, file=sys.stderr, end="", flush=True)
    line = f"posttrain: rank {rank} crashed: {summary}{where}; traceback {f'in {kept}' if kept else 'above'}"
    record_error(line)
    if not os.environ.get(LAUNCHER_SAYS):
        say(line)
