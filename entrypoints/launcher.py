"""torchrun, ending a failed job with one line instead of its ``ChildFailedError`` block.

torchrun ends a job whose worker failed by raising ``ChildFailedError``: a
block naming every failed rank, with torchrun's own traceback, printed after
the rank's line. By then a posttrain rank has said why it stopped (a check:
its ``posttrain:`` line, exit code 2) or left its crash's one-line summary
in torchelastic's error file (exit code 1), which torchrun has copied for
torchx's structured error. This runs torchrun's ``main`` (``@record``, so
that copy still happens) and says only what no rank has said: a crash's
line, or how a rank died that could not speak (a signal: killed, out of
memory). The launcher exits with the failed rank's code.
"""

import logging
import os
import sys
from typing import Mapping, Optional, Sequence, Tuple

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.run import main as torchrun

from posttrain.entrypoints.error_file import CRASHED, LAUNCHER_SAYS, STOPPED, posttrain_line


def failure_line(rank: int, failure: ProcessFailure) -> Optional[str]:
    """What the launcher says of a failed rank; None where the rank said it, or where it ended quietly on a lost
    peer (exit code 1 without a line: the peer's failure is the one to say)."""
    if failure.exitcode < 0:
        hint = " (the system's out-of-memory killer sends it)" if failure.signal_name() == "SIGKILL" else ""
        return f"posttrain: rank {rank} (pid {failure.pid}) was killed by {failure.signal_name()}{hint}"
    line = posttrain_line(failure.error_file_data)
    if line is None and failure.exitcode not in (STOPPED, CRASHED):  # os._exit, sys.exit(n) in the user's code
        return f"posttrain: rank {rank} (pid {failure.pid}) exited with code {failure.exitcode} without saying why"
    return line if failure.exitcode == CRASHED else None


def root_cause(failures: Mapping[int, ProcessFailure]) -> Tuple[int, ProcessFailure]:
    """The failure that explains the others: a rank that left its line and exited by itself, else one a signal
    other than SIGTERM killed (the out-of-memory killer), else one that exited with a code of its own, else the
    earliest.

    When one rank fails, torchrun stops the others with SIGTERM, and a rank it stops may have left the same line
    already (every rank meets a check's error): it is not the cause, nor is a rank that ended on the lost one
    (quietly, exit code 1).
    """

    def order(item: Tuple[int, ProcessFailure]) -> Tuple[bool, bool, bool, int, int]:
        rank, failure = item
        said = failure.exitcode > 0 and posttrain_line(failure.error_file_data) is not None
        killed = failure.exitcode < 0 and failure.signal_name() != "SIGTERM"
        return (not said, not killed, failure.exitcode in (CRASHED, -15), failure.timestamp, rank)

    return min(failures.items(), key=order)


def main(argv: Optional[Sequence[str]] = None) -> int:
    os.environ[LAUNCHER_SAYS] = "1"  # the workers inherit it: a crash's line is left for this process to say
    # its "failed (exitcode: 2) local_rank: 0" and "Sending process closing signal" lines: the failure line says it
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    try:
        torchrun(argv)
    except ChildFailedError as failed:
        rank, failure = root_cause(failed.failures)
        line = failure_line(rank, failure)
        if line:
            print(line, file=sys.stderr, flush=True)
        return failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode
    return 0


if __name__ == "__main__":
    sys.exit(main())
