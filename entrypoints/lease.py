"""One run per output directory: rank 0 of a job holds a lease on ``output_dir`` for as long as the job lives.

The lease is a small JSON file in ``output_dir`` (``.posttrain_lease.json``)
naming its holder: the job (Slurm's job id, else torchrun's run id: torchx's app id), the
attempt, the host and process, when it was taken, and a heartbeat renewed
every :data:`HEARTBEAT_S` seconds. A heartbeat, not a file lock: ``fcntl``
locks are not reliable on every network file system, a file's contents are.

A second run into a held directory stops before any model loads, naming the
holder. A holder is taken over when it is gone: no heartbeat for
:data:`STALE_S` seconds, or its process no longer exists on this host. A
later attempt of the same job (a torchrun restart, a Slurm requeue) takes
its own lease back. A holder that finds its lease taken by another run ends
its job at once (exit 2): two runs never write one directory.
"""

import dataclasses
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import IO, Optional, Tuple

from posttrain.components.spec.messages import SpecError

log = logging.getLogger("posttrain")

LEASE_FILE = ".posttrain_lease.json"
HEARTBEAT_S = 10.0
STALE_S = 60.0  # six missed heartbeats: a holder this quiet is gone (or its clock is far off)


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lease, as its file says."""

    job: str
    attempt: Tuple[int, int]  # (Slurm's restart count, torchrun's): a later attempt of a job is a greater one
    host: str
    pid: int
    since: float
    heartbeat: float
    token: str

    @staticmethod
    def this_process() -> "Holder":
        now = time.time()
        # Slurm's job id first: torchrun's run id is the literal "$SLURM_JOB_ID" there (torchx quotes the macro)
        job = os.environ.get("SLURM_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID") or f"pid-{os.getpid()}"
        attempt = (
            int(os.environ.get("SLURM_RESTART_COUNT", "0")),
            int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        )
        return Holder(job, attempt, socket.gethostname(), os.getpid(), now, now, os.urandom(8).hex())

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"job {self.job} on host {self.host} (pid {self.pid}) since {since}"


def read_holder(output_dir: Path) -> Optional[Holder]:
    """The lease's holder, or None where there is no lease (or only one being written, or damaged)."""
    try:
        data = json.loads((output_dir / LEASE_FILE).read_text())
        data["attempt"] = tuple(data["attempt"])
        return Holder(**data)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def gone_because(holder: Holder, me: Holder, now: float) -> Optional[str]:
    """Why ``holder`` no longer holds its lease against ``me``, or None where it still does."""
    if holder.job == me.job and holder.attempt < me.attempt:
        return f"an earlier attempt of this job (attempt {holder.attempt}) held it"
    if holder.host == me.host and not _alive(holder.pid):
        return f"{holder.describe()} held it, and that process is gone"
    if holder.job == me.job and holder.host == me.host and holder.pid == me.pid:
        return "this process held it"
    quiet = now - holder.heartbeat
    if quiet > STALE_S:
        return f"{holder.describe()} held it, silent for {quiet:.0f} s"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def _held_error(output_dir: Path, holder: Holder, now: float) -> SpecError:
    return SpecError(
        [
            f"training.output_dir: {output_dir} is held by {holder.describe()}, last heartbeat "
            f"{max(now - holder.heartbeat, 0):.0f} s ago; wait for it, stop it, or use another output_dir "
            f"(a holder silent for {STALE_S:.0f} s is taken over)"
        ]
    )


class Lease:
    """The lease this job's rank 0 holds; :meth:`release` gives it back (and the directory, where it made it)."""

    def __init__(self, output_dir: Path, holder: Holder, made_dir: bool) -> None:
        self.output_dir, self.holder, self.made_dir = output_dir, holder, made_dir
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name="posttrain-lease", daemon=True)
        self._heartbeat.start()

    @property
    def path(self) -> Path:
        return self.output_dir / LEASE_FILE

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            found = read_holder(self.output_dir)
            if found is not None and found.token != self.holder.token:
                # another run took the directory (it judged this job gone): stop writing into it, now
                log.error(
                    "training.output_dir: %s was taken over by %s; this job stops", self.output_dir, found.describe()
                )
                os._exit(2)
            try:
                _write(self.path, dataclasses.replace(self.holder, heartbeat=time.time()))
            except OSError as error:  # a full or failing disk: the run itself will say so when it writes
                log.warning("training.output_dir: cannot renew the lease %s: %s", self.path, error)

    def release(self) -> None:
        self._stop.set()
        self._heartbeat.join()
        found = read_holder(self.output_dir)
        if found is not None and found.token == self.holder.token:
            self.path.unlink(missing_ok=True)
        if self.made_dir:
            try:
                self.output_dir.rmdir()  # only if the run wrote nothing else
            except OSError:
                pass


def acquire(output_dir: Path) -> Lease:
    """Takes the lease on ``output_dir`` (creating it), or raises naming the run that holds it.

    Two runs starting at once: exclusive creation lets one in. A takeover of
    a gone holder replaces the file, then reads it back a moment later: of
    two runs taking over at once, the one whose token is not there yields.
    """
    if output_dir.exists() and not output_dir.is_dir():
        raise SpecError([f"training.output_dir: {output_dir} is a file; name a directory (it is made if missing)"])
    made_dir = not output_dir.exists()
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SpecError([f"training.output_dir: cannot create {output_dir}: {error.strerror}"]) from None
    me = Holder.this_process()
    path = output_dir / LEASE_FILE
    deadline = time.monotonic() + 5
    while True:
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            pass
        except OSError as error:
            raise SpecError([f"training.output_dir: cannot write in {output_dir}: {error.strerror}"]) from None
        else:
            with os.fdopen(descriptor, "w") as stream:
                _dump(stream, me)
            return Lease(output_dir, me, made_dir)
        holder = read_holder(output_dir)
        if holder is None:  # being written by a run that just created it, or damaged
            if time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            reason = "its lease file was unreadable"
        else:
            reason = gone_because(holder, me, time.time())
            if reason is None:
                raise _held_error(output_dir, holder, time.time())
        _write(path, me)
        time.sleep(min(1.0, HEARTBEAT_S / 10))
        winner = read_holder(output_dir)
        if winner is None or winner.token != me.token:
            raise _held_error(output_dir, winner or holder or me, time.time())
        log.warning("training.output_dir: took over %s: %s", output_dir, reason)
        return Lease(output_dir, me, made_dir)


def _write(path: Path, holder: Holder) -> None:
    """Writes the lease whole (a temporary file renamed over it): a reader never sees half of one."""
    temporary = path.with_name(f"{path.name}.{holder.token}.tmp")  # one per holder: two may write at once
    with temporary.open("w") as stream:
        _dump(stream, holder)
    os.replace(temporary, path)


def _dump(stream: IO[str], holder: Holder) -> None:
    """The holder as JSON, on disk before the caller goes on (another host may read it next)."""
    stream.write(json.dumps(dataclasses.asdict(holder)))
    stream.flush()
    os.fsync(stream.fileno())
