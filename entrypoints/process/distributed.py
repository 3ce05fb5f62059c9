"""The process group and what every rank does around it: creation, barriers, logging, teardown.

Which backend the group gets, and what joins it afterwards (DeepSpeed), is
the sharding strategy's business (``sharding.py``): this module creates a
group with the backend it is given.
"""

import atexit
import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Callable, Iterator, List, NoReturn, Optional, Sequence, TypeVar, Union

import torch
import torch.distributed as dist

from posttrain.components.spec.messages import SpecError

log = logging.getLogger("posttrain")
T = TypeVar("T")


def device_backend() -> str:
    """The backend collectives use on this hardware: NCCL on GPUs, gloo on CPU."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def group_backend() -> str:
    """The process group's backends: the device's, and gloo beside NCCL for CPU tensors.

    posttrain's own collectives (a flag at every step end, the checks'
    verdict) then stay on the CPU: they create no NCCL communicator (set up
    at start-up otherwise, and never needed by one process) and no step waits
    for the GPU to drain before its flag is read. The trainer's gradients and
    FSDP's CPU offload go to the backend of their tensors' device.
    """
    return "cuda:nccl,cpu:gloo" if device_backend() == "nccl" else "gloo"


def backend_for(device_type: str) -> Optional[str]:
    """The group's backend for tensors on ``device_type`` (of ``cuda:nccl,cpu:gloo``: gloo for the CPU), if any."""
    if not dist.is_initialized():
        return None
    name = str(dist.get_backend())
    per_device = dict(part.split(":", 1) for part in name.split(",") if ":" in part)
    return per_device.get(device_type, name)


def collective_device() -> str:
    """Where posttrain's own collectives put their tensors: the CPU where the group has gloo, else CUDA (NCCL)."""
    return "cpu" if backend_for("cpu") in (None, "gloo") else "cuda"


def init_process_group(backend: str, timeout: timedelta) -> bool:
    """Creates the process group (launched by torchrun or DeepSpeed); False if there is none to create.

    ``backend`` may name one per device (``"cuda:nccl,cpu:gloo"``). The
    timeout bounds every collective, on every backend.
    """
    if "WORLD_SIZE" not in os.environ or dist.is_initialized():
        return False
    # the DeepSpeed launcher says LOCAL_SIZE where torchrun says LOCAL_WORLD_SIZE (accelerate reads the latter)
    if "LOCAL_SIZE" in os.environ:
        os.environ.setdefault("LOCAL_WORLD_SIZE", os.environ["LOCAL_SIZE"])
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torchrun's agent store outlives a worker restart: without a prefix per attempt, restarted
    # workers read the dead workers' addresses and fail to connect (seen with gloo, torch 2.13).
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=not agent_store and rank == 0,
        timeout=timeout,
        multi_tenant=not agent_store,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefixed = dist.PrefixStore(f"posttrain/attempt_{attempt}", store)
    dist.init_process_group(backend=backend, store=prefixed, rank=rank, world_size=world_size, timeout=timeout)
    return True


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def waiting_group(timeout: timedelta) -> Optional[dist.ProcessGroup]:
    """A gloo group of every rank whose collectives wait up to ``timeout``: for ranks that wait while rank 0 alone
    works for longer than the job's own timeout allows (an evaluation's benchmarks); None in one process. Every
    rank calls it."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    return dist.new_group(backend="gloo", timeout=timeout)


def env_rank() -> int:
    """This process's global rank from the launcher's environment: known before, and without, a process group."""
    return int(os.environ.get("RANK", "0"))


def first_message(message: Optional[str]) -> Optional[str]:
    """The first message any rank holds (in rank order), or None where none holds one; every rank calls it.

    A flag all-reduce first (cheap enough for every step); the messages
    themselves travel only when some rank has one. A problem only one rank
    sees (a reward on its own completions) thus reaches rank 0, which prints
    it, and every rank learns to stop at the same point.
    """
    if not dist.is_initialized():
        return message
    flag = torch.tensor([0.0 if message is None else 1.0], device=collective_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() == 0:
        return None
    messages: List[Optional[str]] = [None] * dist.get_world_size()
    dist.all_gather_object(messages, message)
    return next(found for found in messages if found is not None)


@contextlib.contextmanager
def all_ranks_agree() -> Iterator[None]:
    """Runs checks that make no collective call; a SpecError on any rank then ends every rank with it.

    Every rank finishes its checks and meets the others at one collective,
    failing or not: a rank that failed alone can neither leave the others
    waiting in a barrier nor go unheard (only rank 0 prints). The meeting is
    also a barrier: whatever the checks read is read by all before it.
    """
    mine: Optional[SpecError] = None
    try:
        yield
    except SpecError as error:
        mine = error
    first = first_message(None if mine is None else str(mine))
    if first is not None:
        raise SpecError(first.split("\n")) from None


def rank0s(value: T) -> T:
    """Rank 0's ``value``, on every rank (every rank calls it): a choice all must share, such as the checkpoint
    to resume from, which each rank would otherwise make from files that may change between its reads."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def says_any(error: Optional[BaseException], signs: Sequence[str]) -> bool:
    """Whether an exception, or one it was raised from or while handling, says one of ``signs``."""
    while error is not None:
        if any(sign in str(error) for sign in signs):
            return True
        error = error.__cause__ or error.__context__
    return False


# What gloo says when another rank's process ended: its socket to that rank closed
PEER_GONE = ("Connection closed by peer", "Connection reset by peer")
# Where torch's collectives raise into Python: torch.distributed (and FSDP, the store), DDP's forward, and the
# autograd engine (DDP's reducer all-reduces gradients from inside backward)
COLLECTIVE_LAYER = tuple(
    os.path.join(os.path.dirname(torch.__file__), part, "") for part in ("distributed", "nn/parallel", "autograd")
)


def lost_a_peer(error: BaseException) -> bool:
    """Whether a collective failed because another rank's process ended (gloo: its socket closed).

    Told by where the failure came from, never by its words alone: a reward function's or an HTTP client's
    ``ConnectionResetError("Connection reset by peer")`` is a crash of its own, which this rank must say.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        # one process has no peer to lose
        return False
    cause: Optional[BaseException] = error
    while cause is not None:
        if any(sign in str(cause) for sign in PEER_GONE) and raised_by_collectives(cause):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def raised_by_collectives(error: BaseException) -> bool:
    """Whether torch's collective layer raised ``error``: a ``DistError``, or a RuntimeError from a torch frame there."""
    if isinstance(error, dist.DistError):
        return True
    if not isinstance(error, RuntimeError) or error.__traceback__ is None:
        return False
    innermost = error.__traceback__
    while innermost.tb_next is not None:
        innermost = innermost.tb_next
    return innermost.tb_frame.f_code.co_filename.startswith(COLLECTIVE_LAYER)


# How long a rank lets gloo's worker threads finish before the interpreter exits (see destroy_process_group)
GLOO_DRAIN_S = 0.1


def destroy_process_group() -> None:
    """Destroys the group, then lets gloo's worker threads finish what they still hold.

    A gloo worker thread frees a finished collective's tensors only after
    the caller has moved on, and freeing a tensor Python also knows takes the
    GIL. If the interpreter is finalizing by then, the thread exits in the
    middle of C++ and the rank aborts after all its work is done
    ("terminate called without an active exception"; a core dump shows the
    thread in ``~AsyncAllgatherWork``, the main thread in ``Py_FinalizeEx``).
    The group object outlives ``destroy_process_group`` (DDP holds it), so its
    threads are not joined there: the sleep hands them the GIL instead.
    """
    if dist.is_initialized():
        dist.destroy_process_group()
        time.sleep(GLOO_DRAIN_S)


def end_process(code: Union[int, str, None]) -> NoReturn:
    """Ends this process as the interpreter would, less its teardown of every module.

    As the interpreter does first: idle executor workers are told to stop
    and non-daemon threads are waited for (``threading._shutdown``; joining
    them alone waits forever on an executor's idle worker); then atexit
    handlers run (trackers finish their uploads, vLLM stops its engine), logs
    and the standard streams are flushed, and ``os._exit``. Tearing torch,
    transformers and TRL down took a second of each rank's end, and of the
    job's: the tiny SFT through ``torchx run`` took 11.6 s with it, 10.6 s
    without (three runs each).
    """
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    logging.shutdown()
    if isinstance(code, str):
        # SystemExit's own way with a message
        print(code, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)


def exit_after(work: Callable[[], Union[int, str, None]]) -> NoReturn:
    """Runs ``work``, a process's whole life, and ends the process with its exit code (what it returns, or the
    code of the SystemExit it raises) through :func:`end_process`."""
    try:
        code = work()
    except SystemExit as stop:
        code = stop.code
    end_process(code)


def check_shared_output(output_dir: Path, key: str = "training.output_dir") -> None:
    """With several nodes, every node must see ``output_dir`` (the spec's ``key``): rank 0 alone writes what all
    read.

    Rank 0 writes a fresh token there; the first process of every node reads
    it back. A node that cannot is on other storage, and resume or the final
    save would silently split across nodes.
    """
    if not dist.is_initialized():
        return
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    if dist.get_world_size() // local_world_size <= 1:
        return
    marker = output_dir / ".posttrain_shared_check"
    token = [os.urandom(8).hex() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(token, src=0)
    if dist.get_rank() == 0:
        marker.write_text(token[0])
    dist.barrier()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    sees = local_rank != 0 or (marker.is_file() and marker.read_text() == token[0])
    missing = torch.tensor([0.0 if sees else 1.0], device=collective_device())
    dist.all_reduce(missing)
    dist.barrier()
    if dist.get_rank() == 0:
        marker.unlink(missing_ok=True)
    if missing.item() > 0:
        raise SpecError(
            [
                f"{key}: {output_dir} is not on storage every node sees ({int(missing.item())} "
                "node(s) cannot read what rank 0 wrote); use a shared filesystem (NFS, Lustre, a ReadWriteMany "
                "volume) for multi-node jobs"
            ]
        )


def setup_logging() -> None:
    """Rank 0 speaks; the others only warn; any rank prints its stacks on SIGUSR1.

    Only posttrain's own logger: libraries keep theirs.
    """
    rank = env_rank()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s posttrain[{rank}] %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    log.propagate = False
    # a rank that hangs says where: `kill -USR1 PID` prints every thread's Python stack to the process's
    # stderr (the job's log; a file descriptor, which a replaced sys.stderr may lack), and the rank goes on;
    # py-spy needs ptrace, which containers often forbid
    faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)


def end_with_the_launchers_parent(poll_s: float = 1.0) -> None:
    """Ends the job when whatever started torchrun dies: no ranks training on as orphans.

    On ``local_cwd`` the ``torchx run`` client starts torchrun; killed (its
    terminal closed), it leaves torchrun and the ranks running, and a rerun of
    the same command would then meet them in ``output_dir``. The first rank
    of each node watches torchrun's parent; once it is gone, torchrun gets
    SIGTERM, as from a scheduler's preemption: the ranks save a checkpoint at
    the step's end and stop, and the rerun resumes from it.
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ or os.environ.get("LOCAL_RANK", "0") != "0":
        # not under torchrun (DeepSpeed's launcher, a test in process), or not the node's first rank
        return
    agent = os.getppid()
    parent = _parent_of(agent)
    if parent is None or parent <= 1:
        # torchrun is a container's first process, or was already left by its parent
        return

    def watch() -> None:
        while _parent_of(agent) == parent:
            time.sleep(poll_s)
        log.warning("the process that started this job (pid %d) is gone: stopping the job, as at a preemption", parent)
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent, signal.SIGTERM)

    threading.Thread(target=watch, name="posttrain-launcher-watch", daemon=True).start()


def _parent_of(pid: int) -> Optional[int]:
    """A process's parent from ``/proc`` (Linux), or None where it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # after "pid (name) state": the name may hold spaces
    return int(stat.rsplit(")", 1)[1].split()[1])
