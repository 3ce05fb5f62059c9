"""torchrun, ending a failed job with one line instead of its ``ChildFailedError`` block.

torchrun ends a job whose worker failed by raising ``ChildFailedError``: a
block naming every failed rank, with torchrun's own traceback, printed after
the rank's line. By then a posttrain rank has said why it stopped (a check:
its ``posttrain:`` line, exit code 2) or left its crash's one-line summary
in torchelastic's error file (exit code 1), which torchrun has copied for
torchx's structured error. This runs torchrun's ``main`` (``@record``, so
that copy still happens) and says only what no rank has said: a crash's
line, how a rank died that could not speak (a signal: killed, out of
memory), or a check's line that rank 0, stopped by torchrun once another
rank had ended on the same check, did not get to print. The launcher exits
with the failed rank's code.

It also keeps the run's logs: torchrun writes each process's output to files
(``--tee`` reads them back), in a directory torchx's local_cwd deletes when
its client exits; at the end, failed or not, the launcher copies this node's
into ``<output_dir>/logs/`` (not written to while training runs: a full disk
there must not silence the job's last line). A run refused there because
another run holds the directory (``lease.py``), or taken over by one, keeps
none: they are the other run's logs, and the refusal's line says all they hold.

SIGTERM (a scheduler's preemption, ``torchx cancel``) goes on to the ranks,
which save a checkpoint at the end of their step and stop; torchrun waits
:data:`SHUTDOWN_S` for them before it kills them. The launcher then ends
with one line, not torchrun's ``SignalException`` traceback.
"""

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence, Tuple

from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.run import main as torchrun

from posttrain.entrypoints.process import lease
from posttrain.entrypoints.process.error_file import (
    CRASHED,
    DONE_DIR_ENV,
    KEPT_LOGS,
    LAUNCHER_SAYS,
    STOPPED,
    posttrain_line,
    record_error,
)

# After a SIGTERM, how long torchrun waits for the ranks before SIGKILL (its default, 30 s, is short for the end of a
# step plus a checkpoint of a large model); a scheduler's own grace (Slurm's KillWait) may end the wait sooner.
SHUTDOWN_S = 120

# How long the launcher waits before it exits under torchx's local scheduler, which copies the job's output into the
# log its client shows every 0.1 s: torchx 0.7.0's client can see the job end in two threads at once, and then the one
# printing the log stops before the last copy (the second ``LocalScheduler.describe`` closes the app's ``Tee`` while
# the first still drains it), losing the job's last lines, its ``posttrain:`` line among them.
LOG_COPY_S = 0.5


def failure_line(rank: int, failure: ProcessFailure) -> Optional[str]:
    """What the launcher says of a failed rank; None where the rank said it, or where it ended quietly on a lost
    peer (exit code 1 without a line: the peer's failure is the one to say)."""
    if failure.exitcode < 0:
        hint = " (the system's out-of-memory killer sends it)" if failure.signal_name() == "SIGKILL" else ""
        return f"posttrain: rank {rank} (pid {failure.pid}) was killed by {failure.signal_name()}{hint}"
    line = posttrain_line(failure.error_file_data)
    # os._exit, sys.exit(n) in the user's code
    if line is None and failure.exitcode not in (STOPPED, CRASHED):
        return f"posttrain: rank {rank} (pid {failure.pid}) exited with code {failure.exitcode} without saying why"
    return line if failure.exitcode == CRASHED else None


def unsaid_line(failures: Mapping[int, ProcessFailure], done: Path) -> Optional[str]:
    """The line of a check every rank met where no rank of this node printed it (``error_file.say`` leaves
    a mark in ``done``): rank 0 prints such a line, and torchrun stops rank 0 (SIGTERM) as soon as another rank has
    ended on it, maybe before rank 0 got there (a loaded machine). Said by the node of rank 0 alone: the other nodes'
    ranks leave it to rank 0's."""
    if 0 not in failures or any(done.glob("said-*")):
        return None
    lines = [posttrain_line(failure.error_file_data) for failure in failures.values() if failure.exitcode == STOPPED]
    return next((line for line in lines if line), None)


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


def kept_logs(argv: Sequence[str]) -> Optional[Path]:
    """Where the run's logs are kept: ``logs`` in the output directory of the spec the workers are given."""
    if "--spec-json" not in argv[:-1]:
        return None
    spec = json.loads(argv[list(argv).index("--spec-json") + 1])
    # an evaluation's output_dir is at the top of its spec
    return Path(spec["output_dir"] if "output_dir" in spec else spec["training"]["output_dir"]) / "logs"


def keep_logs(log_dir: Path, kept: Path) -> None:
    """Copies the run directories torchrun made in this launcher's ``log_dir`` into ``kept``, where the job made its
    output directory; a copy that fails (a full or read-only disk: the job has said so) is left."""
    # stopped before it made one (a check): nothing of the run to keep beside
    if not kept.parent.is_dir():
        return
    for run in sorted(os.listdir(log_dir)):
        with contextlib.suppress(OSError):
            shutil.copytree(log_dir / run, kept / run, dirs_exist_ok=True)


def stopped_line(signum: int, argv: Sequence[str]) -> str:
    """What the launcher says when a signal stopped the job: the ranks were told to save a checkpoint (an
    evaluation keeps the prompts it finished)."""
    kept = kept_logs(argv)
    where = f" in {kept.parent}" if kept is not None else ""
    if "posttrain.entrypoints.eval" in argv:
        return (
            f"posttrain: stopped by {signal.Signals(signum).name}: the same command again samples only the prompts "
            f"not finished{where}"
        )
    return (
        f"posttrain: stopped by {signal.Signals(signum).name}: the ranks were told to save a checkpoint at the end of "
        f"their step (given {SHUTDOWN_S} s) and stop; a restart resumes from the latest checkpoint{where}"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # the workers inherit it: a crash's line is left for this process to say
    os.environ[LAUNCHER_SAYS] = "1"
    # its "failed (exitcode: 2) local_rank: 0" and "Sending process closing signal" lines: the failure line says it
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    # its "Received 15 death signal, shutting down workers": the stopped line says it
    logging.getLogger("torch.distributed.elastic.agent.server.api").setLevel(logging.ERROR)
    # torchrun's wait after a SIGTERM
    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_S))
    kept = kept_logs(argv)
    # torchrun's place (torchx's local_cwd names one for all its nodes), a directory of this launcher's own in it
    parent = os.environ.get("PET_LOG_DIR")
    if parent:
        os.makedirs(parent, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="torchelastic_", dir=parent or None))
    if kept is not None:
        # rank 0's first line names it
        os.environ[KEPT_LOGS] = str(kept)
    # each rank says there that its run finished (error_file.report_done), or that it printed its last line
    done = Path(tempfile.mkdtemp(prefix="posttrain-ranks-done-"))
    os.environ[DONE_DIR_ENV] = str(done)
    # torchx reads the replica's error file as soon as it exists, and torchrun writes it in place: written aside, it
    # is moved in whole (a half-written file made torchx's log printer raise)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        os.environ["TORCHELASTIC_ERROR_FILE"] = f"{error_file}.{os.getpid()}.tmp"
    try:
        return _launch(argv, log_dir, kept, done)
    finally:
        shutil.rmtree(done, ignore_errors=True)
        if error_file and os.path.exists(os.environ["TORCHELASTIC_ERROR_FILE"]):
            os.replace(os.environ["TORCHELASTIC_ERROR_FILE"], error_file)
        # torchx's local scheduler names the parent
        if parent:
            time.sleep(LOG_COPY_S)


def _launch(argv: Sequence[str], log_dir: Path, kept: Optional[Path], done: Path) -> int:
    """torchrun over ``argv``, its logs in ``log_dir`` (kept in ``kept``), its ranks saying in ``done`` that they
    finished; the launcher's exit code."""
    # whether output_dir is this run's: a refused run's logs stay out of the holder's
    ours = True
    try:
        torchrun(["--log-dir", str(log_dir), *argv])
    except SignalException as stopped:
        # torchrun passed it on to the ranks and waited for them
        line = stopped_line(stopped.sigval, argv)
        # in place of the exception torchrun's @record left: torchx's structured error
        record_error(line)
        print(line, file=sys.stderr, flush=True)
        return 128 + stopped.sigval
    except ChildFailedError as failed:
        rank, failure = root_cause(failed.failures)
        ours = not lease.says_not_this_runs(posttrain_line(failure.error_file_data))
        line = failure_line(rank, failure) or unsaid_line(failed.failures, done)
        if line:
            print(line, file=sys.stderr, flush=True)
        return failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode
    finally:
        if kept is not None and ours:
            keep_logs(log_dir, kept)
    line = unfinished_line(done, argv)
    if line is not None:
        record_error(line)
        print(line, file=sys.stderr, flush=True)
        return STOPPED
    return 0


def unfinished_line(done: Path, argv: Sequence[str]) -> Optional[str]:
    """What the launcher says where torchrun ended well but a rank of this node never said its run finished: it
    ended with exit code 0 before its end (``os._exit`` in user code, or a process that left quietly), and nothing
    the job wrote may be taken as finished; None where every rank said so."""
    ranks = int(argv[list(argv).index("--nproc_per_node") + 1]) if "--nproc_per_node" in argv else 1
    reported = len(list(done.glob("rank-*")))
    if reported >= ranks:
        return None
    return (
        f"posttrain: {ranks - reported} of this node's {ranks} rank(s) ended with exit code 0 before their run "
        "finished (os._exit in user code, or a process ended from outside): the job did not finish"
    )


if __name__ == "__main__":
    sys.exit(main())
