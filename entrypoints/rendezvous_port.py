"""Before a multi-node job's launcher starts: is the rendezvous port free on the rank-0 host?

torchrun's c10d rendezvous (and the static one's store) listens on
``--rdzv_port`` of the rank-0 host. Where another program already listens
there, torchrun connects to it as if it were the store and waits, without a
word, until it is killed. Every node runs this first (``python -m
posttrain.entrypoints.rendezvous_port PORT NODE RANK0_HOST JOB``): node 0 says
a port in use in one line and ends. Another node on the same host (local_cwd)
ends with it, quietly, unless what listens is this job's own (node 0 may have
started its launcher already); nodes elsewhere go on. Node 0 goes on, too,
where the listener is this job's own: on one host another node's torchrun
may start first and host the store. Standard library only:
it runs before every launch.
"""

import socket
import sys
from pathlib import Path
from typing import Optional

from posttrain.entrypoints.process.error_file import record_error


def in_use(port: int) -> bool:
    """Whether a program listens on ``port`` of any interface (a closed connection's TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # as the store binds
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return True
    return False


def listener_command(port: int) -> Optional[str]:
    """The command line of the process listening on ``port`` (Linux's ``/proc``), or None where it cannot be told."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # 0A: LISTEN
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                inodes.add(f"socket:[{fields[9]}]")
    for descriptor in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            if str(descriptor.readlink()) in inodes:
                return (descriptor.parents[1] / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            # a process that ended, or another user's
            continue
    return None


def main(argv: list) -> int:
    port, node, rank0_host, job = int(argv[0]), argv[1], argv[2], argv[3]
    local = rank0_host in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn())
    if node != "0" and not local:
        # the port is on another host, which node 0 checks
        return 0
    if not in_use(port):
        return 0
    listener = listener_command(port)
    # this job's torchrun: its run id is the job's (on one host another node's may start first and host the store)
    ours = listener is not None and job in listener
    if node != "0":
        # also DeepSpeed's launcher's rank 0, or a listener that cannot be told: go on; node 0 says why otherwise
        return 0 if ours or listener is None or "posttrain.entrypoints." in listener else 2
    if ours:
        return 0
    line = (
        f"posttrain: --rdzv_port {port} is in use on {socket.gethostname()}, the job's rank-0 host (another "
        "program, or another job, listens on it); pass a free one with --rdzv_port"
    )
    print(line, file=sys.stderr, flush=True)
    record_error(line)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
