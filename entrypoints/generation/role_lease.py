"""The trainers' side of the ``vllm`` role: the lease rank 0 holds on it, and where the role is.

The role's own side is ``entrypoints/vllm_server.py``. The lease is a TCP
connection to ``vllm_server_port + 1``, opened after each side proves it holds
the job's token (:func:`handshake`), held while the trainers live and closed
with ``done`` at a clean end; the role stops its server when it closes.
"""

import contextlib
import hmac
import os
import select
import socket
import time
from typing import Any, Iterator, List, Mapping

from posttrain.components.spec.generation import VLLM_HOST_VARIABLE
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.generation import vllm_token

# how often a wait looks at the other side
POLL_S = 2.0
# how long a connection to the lease has to say the job's token
HANDSHAKE_S = 5.0


def lease_port(server_port: int) -> int:
    """Where the trainers' rank 0 holds its lease: the port after the server's."""
    return server_port + 1


def route_address(host: str) -> str:
    """This host's address on the route to ``host`` (the kernel picks it; nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as route:
        route.connect((socket.gethostbyname(host), 9))
        return route.getsockname()[0]


def handshake(connection: socket.socket, token: str) -> None:
    """The trainers' side of the lease's handshake: the role proves it holds the job's token, then this process
    does; raises OSError where what listens proves nothing (the token itself never crosses)."""
    nonce = os.urandom(16).hex().encode()
    connection.settimeout(HANDSHAKE_S)
    connection.sendall(nonce + b"\n")
    answer = b""
    while not answer.endswith(b"\n") and len(answer) < 1024:
        chunk = connection.recv(1024)
        if not chunk:
            break
        answer += chunk
    role_proof, _, role_nonce = answer.strip().partition(b" ")
    if not role_nonce.isalnum() or not hmac.compare_digest(role_proof, vllm_token.proof(token, b"role", nonce)):
        raise NotTheRole(f"{connection.getpeername()[0]}:{connection.getpeername()[1]}")
    connection.sendall(vllm_token.proof(token, b"trainer", role_nonce) + b"\n")


class NotTheRole(OSError):
    """What listens on the role's port did not prove it holds the job's token."""


def keep_alive(lease: socket.socket) -> None:
    """A trainer host that vanishes (power, network) sends no close: TCP keepalive notices it within about a minute."""
    lease.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        # Linux names
        if hasattr(socket, option):
            lease.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


@contextlib.contextmanager
def lease(training: Mapping[str, Any]) -> Iterator[None]:
    """The trainers' side, on rank 0 of a job with a ``vllm`` role: held from the start, ``done`` at a clean end.

    An exception just drops it: with torchrun restarts (``--max_restarts``) the
    server waits its grace for the restarted rank 0.
    """
    host = os.environ.get(VLLM_HOST_VARIABLE)
    if not host or int(os.environ.get("RANK", "0")) != 0:
        yield
        return
    token = vllm_token.required_token("the trainers")
    port = lease_port(training.get("vllm_server_port", 8000))
    timeout_s = training.get("vllm_server_timeout", 240)
    deadline = time.monotonic() + timeout_s
    while True:
        held = None
        try:
            held = socket.create_connection((host, port), timeout=POLL_S)
            # the role gives its lease to the job only, and is the job's own
            handshake(held, token)
            # and a vanished role host shows in role_exited
            keep_alive(held)
            break
        except NotTheRole as where:
            held.close()
            raise SpecError(
                [
                    f"vllm role: what listens at {where} did not prove it holds the job's token: not this job's "
                    "vllm role (another process on its port?); nothing was sent to it"
                ]
            ) from None
        except OSError as error:
            if held is not None:
                held.close()
            if time.monotonic() > deadline:
                raise SpecError(
                    [
                        f"training.vllm_server_timeout: the vllm role at {host}:{port} did not answer within "
                        f"{timeout_s:.0f} s ({error}); see its log"
                    ]
                ) from None
            time.sleep(POLL_S)
    _HELD[:] = [held]
    try:
        yield
        # a role gone already needs no done
        with contextlib.suppress(OSError):
            held.sendall(b"done")
    finally:
        _HELD.clear()
        held.close()


# the lease this process holds
_HELD: List[socket.socket] = []


def role_exited() -> bool:
    """Whether the role whose lease this process holds has gone (its end of the connection closed)."""
    if not _HELD or not select.select(_HELD, [], [], 0)[0]:
        # nothing to read: the role is there (it never writes on the lease)
        return False
    try:
        return _HELD[0].recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True
