"""One node of a job launched by DeepSpeed's launcher instead of torchrun (``--launcher deepspeed``).

The component runs this on every node::

    python -m posttrain.entrypoints.deepspeed_launcher --nnodes 2 --nproc_per_node 8 --node_rank 0 \\
        --master_addr HOST --master_port 29500 -m posttrain.entrypoints.sft --spec-json ...

It writes a hostfile listing every node in the same order (the names are
only keys: with ``--no_ssh`` and ``--master_addr`` the runner never resolves
or reaches them) and runs ``python -m deepspeed.launcher.runner --no_ssh``
with this node's rank. Rank 0's address is given, or the runner would ssh
to the first host to find it.

The runner's exit status is not the verdict: when its ``launch`` child dies
by a signal it exits 0 and leaves the ranks running (measured with
DeepSpeed 0.19.8). So every rank reports its success in a directory given
to it here (``POSTTRAIN_RANKS_DONE_DIR``, see ``error_file.report_done``), and the node
succeeds only if the runner did and all of its ranks reported.
"""

import argparse
import importlib.util
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Sequence

from posttrain.entrypoints.process.error_file import DONE_DIR_ENV

# After a SIGTERM, how long the ranks get to save and exit (DeepSpeed's launch gives
# them 30 s) before what is left of the node's processes is killed.
_GRACE_S = 40.0


def hostfile_text(nnodes: int, nproc_per_node: int) -> str:
    """Every node, in node-rank order, with one slot per process.

    >>> print(hostfile_text(2, 8), end="")
    node-0 slots=8
    node-1 slots=8
    """
    return "".join(f"node-{rank} slots={nproc_per_node}\n" for rank in range(nnodes))


def runner_command(options: argparse.Namespace, module: str, hostfile: Path, master_port: int) -> List[str]:
    """DeepSpeed's runner for this node, up to the entrypoint's own arguments."""
    return [
        sys.executable,
        "-m",
        "deepspeed.launcher.runner",
        "--no_ssh",
        "--node_rank",
        str(options.node_rank),
        "--master_addr",
        options.master_addr,
        "--master_port",
        str(master_port),
        "--hostfile",
        str(hostfile),
        "--num_nodes",
        str(options.nnodes),
        "--num_gpus",
        str(options.nproc_per_node),
        "--no_local_rank",
        "--module",
        module,
    ]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m posttrain.entrypoints.deepspeed_launcher", usage="%(prog)s OPTIONS -m MODULE [ARGS ...]"
    )
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--nproc_per_node", type=int, required=True)
    parser.add_argument("--node_rank", type=int, required=True)
    parser.add_argument("--master_addr", required=True)
    parser.add_argument("--master_port", type=int, required=True, help="0: a free port (one node only)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-m" not in argv[:-1]:
        parser.error("expected -m MODULE: the entrypoint every rank runs, then its arguments")
    split = argv.index("-m")
    options = parser.parse_args(argv[:split])
    # as torchrun: all after the module is its own
    module, module_args = argv[split + 1], argv[split + 2 :]
    if options.master_port == 0 and options.nnodes > 1:
        parser.error("--master_port 0 (a free port) works on one node only")
    if importlib.util.find_spec("deepspeed") is None:
        print("posttrain: --launcher deepspeed: DeepSpeed is not installed in the job's environment", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="posttrain-deepspeed-") as scratch:
        hostfile, done = Path(scratch) / "hostfile", Path(scratch) / "done"
        hostfile.write_text(hostfile_text(options.nnodes, options.nproc_per_node))
        done.mkdir()
        command = runner_command(options, module, hostfile, options.master_port or _free_port())
        print(f"posttrain: node {options.node_rank}: {shlex.join(command)} ...", file=sys.stderr, flush=True)
        # its own process group: signals reach the runner, DeepSpeed's launch and the ranks alike
        runner = subprocess.Popen(
            command + module_args, env={**os.environ, DONE_DIR_ENV: str(done)}, start_new_session=True
        )
        received: List[int] = []

        def forward(signum: int, _frame: object) -> None:
            received.append(signum)
            _signal_group(runner.pid, signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        code = runner.wait()
        if received:
            _wait_for_group(runner.pid, _GRACE_S)
        # nobody watches what the runner left behind (ranks whose launch died): end it
        _signal_group(runner.pid, signal.SIGKILL)
        reported = {path.name for path in done.iterdir()}

    if received:
        return 128 + received[0]
    if code != 0:
        return code if code > 0 else 128 - code
    first = options.node_rank * options.nproc_per_node
    missing = [rank for rank in range(first, first + options.nproc_per_node) if f"rank-{rank}" not in reported]
    if missing:
        print(
            f"posttrain: DeepSpeed's launcher exited 0, but rank(s) {', '.join(map(str, missing))} never reported "
            "finishing (killed by a signal, or the launcher was): the job failed",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def _signal_group(pgid: int, signum: int) -> bool:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


def _wait_for_group(pgid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _signal_group(pgid, 0) and time.monotonic() < deadline:
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
