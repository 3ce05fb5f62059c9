"""One run per output directory: rank 0 of a job holds a lease on ``output_dir`` for as long as the job lives.

The lease is a small JSON file in ``output_dir`` (``.posttrain_lease.json``)
naming its holder: the job, the attempt, the host and process, when it was
taken, and a heartbeat renewed every :data:`HEARTBEAT_S` seconds (a counter,
``beat``). A heartbeat, not a file lock: ``fcntl`` locks are not reliable on
every network file system, a file's contents are.

A second run into a held directory stops before any model loads, naming the
holder. Each fact a newcomer decides from holds where it decides:

- alive or gone is seen, not computed from two hosts' clocks: a holder is
  gone when its lease does not change for :data:`STALE_S` seconds of the
  newcomer's own monotonic clock (a live holder renews it meanwhile, so a
  newcomer waits up to one heartbeat before it refuses);
- a process id means something only in its PID namespace on its boot: where
  host, boot id and PID namespace are the newcomer's own (not across
  containers that share a host name), the holder's process (its id and start
  time, so a reused id is not it) decides at once: alive, the newcomer
  refuses; gone, it takes over;
- a job is named by torchx's app id (torchrun's run id), which two runs in
  one Slurm allocation do not share, else by the Slurm job and step: a later
  attempt of the same job (a torchrun restart, a Slurm requeue) takes its own
  lease back;
- a lease that exists and cannot be read is held (the line says why).

Taking over is exclusive: the newcomers that judged one lease gone race for
a claim named after its bytes (exclusive creation), and the one that gets
it replaces the lease only if it still holds those bytes. A holder that finds
its lease taken by another run ends its job at once (exit 2, its line in the
error file torchrun and torchx read; torchrun stops the job's other ranks):
two runs never write one directory. Limit: a holder paused longer than
:data:`STALE_S` (SIGSTOP, a suspended job) is taken over; it stops at its
first heartbeat after it resumes.
"""

import dataclasses
import hashlib
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import IO, Optional, Tuple

from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.process.error_file import stop_now

log = logging.getLogger("posttrain")

LEASE_FILE = ".posttrain_lease.json"
HEARTBEAT_S = 5.0
# twelve missed heartbeats, as this host's monotonic clock counts them: a holder this quiet is gone
STALE_S = 60.0


def job_name() -> str:
    """What names this job across its restarts, and no other job: torchx's app id (torchrun's run id), else the
    Slurm job and step, else this process."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    # torchrun's default run id is "none"; torchx on Slurm leaves the literal "$SLURM_JOB_ID" (it quotes the macro)
    if run_id and run_id != "none" and "$" not in run_id:
        return run_id
    if os.environ.get("SLURM_JOB_ID"):
        step = os.environ.get("SLURM_STEP_ID")
        return f"slurm-{os.environ['SLURM_JOB_ID']}" + (f".{step}" if step else "")
    return f"pid-{os.getpid()}"


def process_space() -> str:
    """Where a process id names one process: this boot's id and this PID namespace; empty where unknown."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lease, as its file says."""

    job: str
    # (Slurm's restart count, torchrun's): a later attempt of a job is a greater one
    attempt: Tuple[int, int]
    host: str
    pid: int
    # the process's start, in clock ticks since boot: with pid, this process and no later one
    pid_start: int
    # where pid means this process (process_space())
    process_space: str
    # wall clock, for people to read: no decision compares it with another host's clock
    since: float
    beat: int
    token: str

    @staticmethod
    def this_process() -> "Holder":
        attempt = (
            int(os.environ.get("SLURM_RESTART_COUNT", "0")),
            int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        )
        pid = os.getpid()
        start = process_start(pid) or 0
        return Holder(
            job_name(), attempt, socket.gethostname(), pid, start, process_space(), time.time(), 0, os.urandom(8).hex()
        )

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"job {self.job} on host {self.host} (pid {self.pid}) since {since}"


def parse_holder(data: bytes) -> Optional[Holder]:
    """The holder a lease's bytes name, or None where they name none (damaged)."""
    try:
        fields = json.loads(data)
        fields["attempt"] = tuple(fields["attempt"])
        return Holder(**fields)
    except (ValueError, TypeError, KeyError):
        return None


def read_holder(output_dir: Path) -> Optional[Holder]:
    """The lease's holder, or None where there is no lease, or none this process can read."""
    try:
        return parse_holder((output_dir / LEASE_FILE).read_bytes())
    except OSError:
        return None


def gone_at_once(holder: Holder, me: Holder) -> Optional[str]:
    """Why ``holder`` no longer holds its lease against ``me`` by what both lease files say, or None where it does
    or only watching its heartbeat can tell."""
    if holder.job == me.job and holder.attempt < me.attempt:
        return f"an earlier attempt of this job (attempt {holder.attempt}) held it"
    if not _same_space(holder, me):
        return None
    if holder.pid == me.pid:
        return "this process held it"
    # none, or a later process given the same id
    if process_start(holder.pid) != holder.pid_start:
        return f"{holder.describe()} held it, and that process is gone"
    return None


def alive_at_once(holder: Holder, me: Holder) -> bool:
    """Whether ``holder``'s process is known to live: its id means the same process here, and it runs."""
    return _same_space(holder, me) and holder.pid != me.pid and process_start(holder.pid) == holder.pid_start


def _same_space(holder: Holder, me: Holder) -> bool:
    return holder.host == me.host and holder.process_space == me.process_space != ""


def process_start(pid: int) -> Optional[int]:
    """When process ``pid`` started, in clock ticks since boot; None where there is no such process (or no /proc)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


# What a line says where output_dir is another run's: every refusal of acquire() that finds a lease there, and a
# takeover. A job that says one never held the directory (or no longer does): its launcher keeps no logs there.
NOT_THIS_RUNS = (
    " is held by ",
    f" holds a lease ({LEASE_FILE}) this run cannot read ",
    "'s lease was claimed by a run that never took it ",
    " was taken over by ",
)


def says_not_this_runs(line: Optional[str]) -> bool:
    """Whether a ``posttrain:`` line says the job's output_dir is another run's (see :data:`NOT_THIS_RUNS`)."""
    prefixes = ("posttrain: training.output_dir: ", "posttrain: output_dir: ")
    return line is not None and line.startswith(prefixes) and any(phrase in line for phrase in NOT_THIS_RUNS)


def _held_error(output_dir: Path, key: str, holder: Optional[Holder]) -> SpecError:
    who = holder.describe() if holder is not None else "another run (its lease is being written)"
    return SpecError(
        [
            f"{key}: {output_dir} is held by {who}, whose heartbeat goes on; wait for it, stop it, "
            f"or use another output_dir (a holder whose heartbeat stops for {STALE_S:.0f} s is taken over)"
        ]
    )


def watch(path: Path, seen: bytes) -> str:
    """Watches the lease for :data:`STALE_S` seconds of this host's monotonic clock: ``"changed"`` (its holder
    renewed it, or another run took it), ``"released"`` (it is gone), or ``"unchanged"`` (its holder is gone)."""
    deadline = time.monotonic() + STALE_S
    while time.monotonic() < deadline:
        time.sleep(min(1.0, HEARTBEAT_S / 5))
        try:
            if path.read_bytes() != seen:
                return "changed"
        except FileNotFoundError:
            return "released"
        except OSError:
            # a read that fails now and then (a network file system): the lease is there
            continue
    return "unchanged"


class Lease:
    """The lease this job's rank 0 holds; :meth:`release` gives it back (and the directory, where it made it)."""

    def __init__(
        self, output_dir: Path, key: str, holder: Holder, made_dir: bool, claim: Optional[Path] = None
    ) -> None:
        self.output_dir, self.key, self.holder, self.made_dir, self.claim = output_dir, key, holder, made_dir, claim
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
                stop_now(
                    f"posttrain: {self.key}: {self.output_dir} was taken over by {found.describe()}; this job stops"
                )
            self.holder = dataclasses.replace(self.holder, beat=self.holder.beat + 1)
            try:
                _write(self.path, self.holder)
            except OSError as error:
                # a full or failing disk: the run itself will say so when it writes
                log.warning("%s: cannot renew the lease %s: %s", self.key, self.path, error)

    def release(self) -> None:
        self._stop.set()
        self._heartbeat.join()
        found = read_holder(self.output_dir)
        if found is not None and found.token == self.holder.token:
            self.path.unlink(missing_ok=True)
        # names a predecessor's bytes, which no lease will hold again
        if self.claim is not None:
            self.claim.unlink(missing_ok=True)
        if self.made_dir:
            try:
                # only if the run wrote nothing else
                self.output_dir.rmdir()
            except OSError:
                pass


def acquire(output_dir: Path, key: str = "training.output_dir") -> Lease:
    """Takes the lease on ``output_dir`` (creating it), or raises naming the run that holds it; ``key``: the spec's
    key that names the directory, as the messages say it."""
    if output_dir.exists() and not output_dir.is_dir():
        raise SpecError([f"{key}: {output_dir} is a file; name a directory (it is made if missing)"])
    made_dir = not output_dir.exists()
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SpecError([f"{key}: cannot create {output_dir}: {error.strerror}"]) from None
    me = Holder.this_process()
    path = output_dir / LEASE_FILE
    # a lease judged gone whose claim another run made and never took up
    unclaimed: Optional[bytes] = None
    while True:
        if _create(path, me, key):
            return Lease(output_dir, key, me, made_dir)
        try:
            seen = path.read_bytes()
        except FileNotFoundError:
            # released since: try again
            continue
        except OSError as error:
            raise SpecError(
                [
                    f"{key}: {output_dir} holds a lease ({LEASE_FILE}) this run cannot read "
                    f"({error.strerror}): another run may hold it; use another output_dir, or remove the file once "
                    "no run uses the directory"
                ]
            ) from None
        holder = parse_holder(seen)
        reason = gone_at_once(holder, me) if holder is not None else None
        if reason is None and holder is not None and alive_at_once(holder, me):
            raise _held_error(output_dir, key, holder)
        if reason is None:
            log.info(
                "%s: %s is leased to %s; watching its heartbeat (up to %.0f s) to see if it lives",
                key,
                output_dir,
                holder.describe() if holder is not None else "a run whose lease is unreadable",
                STALE_S,
            )
            outcome = watch(path, seen)
            if outcome == "released":
                continue
            if outcome == "changed":
                raise _held_error(output_dir, key, parse_holder(_read_or_empty(path)) or holder)
            who = holder.describe() if holder is not None else "a damaged lease"
            reason = f"{who} held it, and its heartbeat did not change for {STALE_S:.0f} s"
        claim = _take_over(path, seen, me, key)
        # another run claimed it first: its lease is the one to watch now
        if claim is None:
            # judged gone twice, and the run that claimed it never took it
            if seen == unclaimed:
                raise SpecError(
                    [
                        f"{key}: {output_dir}'s lease was claimed by a run that never took it "
                        f"({_claim_name(seen)}); remove that file and {LEASE_FILE} once no run uses the directory"
                    ]
                )
            unclaimed = seen
            continue
        log.warning("%s: took over %s: %s", key, output_dir, reason)
        return Lease(output_dir, key, me, made_dir, claim)


def _claim_name(seen: bytes) -> str:
    return f"{LEASE_FILE}.claim-{hashlib.sha256(seen).hexdigest()[:16]}"


def _take_over(path: Path, seen: bytes, me: Holder, key: str) -> Optional[Path]:
    """Replaces the lease whose bytes are ``seen`` with ``me``'s, if this run is the one that claims it and it
    still holds them; the claim, else None."""
    claim = path.with_name(_claim_name(seen))
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return None
    # renewed or replaced since it was watched
    if _read_or_empty(path) != seen:
        claim.unlink(missing_ok=True)
        return None
    try:
        _write(path, me)
    except OSError as error:
        raise SpecError([f"{key}: cannot write in {path.parent}: {error.strerror}"]) from None
    return claim


def _read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _create(path: Path, holder: Holder, key: str) -> bool:
    """Creates the lease whole where there is none (a file written aside, then linked: exclusive, and safe on
    network file systems); False where one exists."""
    try:
        temporary = _written_aside(path, holder)
        try:
            os.link(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
    except FileExistsError:
        return False
    except OSError as error:
        raise SpecError([f"{key}: cannot write in {path.parent}: {error.strerror}"]) from None
    return True


def _write(path: Path, holder: Holder) -> None:
    """Writes the lease whole (a file written aside, renamed over it): a reader never sees half of one."""
    os.replace(_written_aside(path, holder), path)


def _written_aside(path: Path, holder: Holder) -> Path:
    # one per holder: two may write at once
    temporary = path.with_name(f"{path.name}.{holder.token}.tmp")
    with temporary.open("w") as stream:
        _dump(stream, holder)
    return temporary


def _dump(stream: IO[str], holder: Holder) -> None:
    """The holder as JSON, on disk before the caller goes on (another host may read it next)."""
    stream.write(json.dumps(dataclasses.asdict(holder)))
    stream.flush()
    os.fsync(stream.fileno())
