"""The job's secret between the trainers and the ``vllm`` role: only the job's own processes get in.

vLLM's server runs in dev mode for TRL's weight sync, and its dev endpoints
(``/collective_rpc`` among them: it loads weights from a path it is sent) are
outside what vLLM's own ``--api-key`` guards. :class:`RequireToken`, given to
the server as ``--middleware``, refuses every request but ``/health`` (the
trainers' wait for the server) without ``Authorization: Bearer <token>``;
the trainers' client sends it (``vllm_generation.py``) once the server has
proved it holds the token too (``/posttrain/proof``: an HMAC of the trainers'
nonce keyed by the token), and the lease (``vllm_server.py``) is held only by
a connection that proves it the same way. The token itself never goes to a
process that has not proved it is the job's.

The token is the job's: ``POSTTRAIN_VLLM_TOKEN``, which the component makes
for each job in the submitting environment (local_cwd and Slurm jobs inherit
it, ``components/vllm_role.py``), or the first line of the file
``POSTTRAIN_VLLM_TOKEN_PATH`` names (Kubernetes: a file on a mounted volume,
as for ``HF_TOKEN_PATH``). Each process of the job has it, no argument, spec
or log line does. The trainers take it out of their environment as they
start (:func:`take_from_environment`): a reward function gets it only by
asking (:func:`job_token`). Where it is missing the server refuses
everything: closed, not open, and both roles say so in one line before vLLM
starts.
"""

import hashlib
import hmac
import json
import os
from typing import Any, Awaitable, Callable, Dict, Optional
from urllib.parse import parse_qsl

from posttrain.components.spec.generation import VLLM_TOKEN_PATH_VARIABLE, VLLM_TOKEN_VARIABLE
from posttrain.components.spec.messages import SpecError

# the trainers wait on it before they hold the token's first use
OPEN_PATHS = ("/health",)
# where the server proves it holds the job's token before any trainer sends it: GET ?nonce=<hex> -> {"proof": ...}
PROOF_PATH = "/posttrain/proof"


# the token a trainer process took out of its environment (take_from_environment)
_TAKEN: Dict[str, str] = {}


def take_from_environment() -> None:
    """In a trainer process, before any user code runs: the token moves from the environment into this module,
    so reward functions and the processes they start do not get it; ``job_token()`` gives it to code that asks."""
    token = os.environ.pop(VLLM_TOKEN_VARIABLE, None)
    if token:
        _TAKEN["token"] = token


def job_token() -> Optional[str]:
    """The job's token: the variable, else the first line of the file the path variable names; None if neither."""
    token = _TAKEN.get("token") or os.environ.get(VLLM_TOKEN_VARIABLE)
    path = os.environ.get(VLLM_TOKEN_PATH_VARIABLE)
    if not token and path:
        try:
            with open(path, encoding="utf-8") as file:
                token = file.readline().strip()
        except OSError:
            return None
    return token or None


def required_token(who: str) -> str:
    """The job's token, or one line saying where it should have come from (``who``: the role or the trainers)."""
    token = job_token()
    if token:
        return token
    path = os.environ.get(VLLM_TOKEN_PATH_VARIABLE)
    where = f"{VLLM_TOKEN_PATH_VARIABLE}={path} gives none (unreadable or empty)" if path else "it has none"
    raise SpecError(
        [
            f"{who}: the job's vLLM token is missing ({where}); `torchx run` makes one for local_cwd and Slurm jobs "
            f"({VLLM_TOKEN_VARIABLE}, inherited); on other schedulers write one to a file the job reads and pass "
            f"--env {VLLM_TOKEN_PATH_VARIABLE}=<file> (docs: Generating with vLLM, Security)"
        ]
    )


def proof(token: str, side: bytes, nonce: bytes) -> bytes:
    """What ``side`` (``role`` or ``trainer``) answers to ``nonce`` to show it holds the job's token, which it
    never sends: an HMAC of the nonce keyed by the token, in hex."""
    return hmac.new(token.encode(), side + b":" + nonce, hashlib.sha256).hexdigest().encode()


def matches(given: bytes, token: Optional[str]) -> bool:
    """Whether ``given`` is the job's token, compared in constant time; never where there is no token."""
    if not token:
        return False
    return hmac.compare_digest(hashlib.sha256(given).digest(), hashlib.sha256(token.encode()).digest())


class RequireToken:
    """ASGI middleware (vLLM's ``--middleware``): every HTTP or WebSocket request but ``/health`` needs the token."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app
        self.token = job_token()

    async def __call__(self, scope: Dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and self._path(scope) == PROOF_PATH:
            await self._prove(scope, send)
        elif scope["type"] not in ("http", "websocket") or self._allowed(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            # policy violation
            await send({"type": "websocket.close", "code": 1008})
        else:
            body = b'{"error": "Unauthorized: this server answers its job\'s own processes only"}'
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})

    async def _prove(self, scope: Dict[str, Any], send: Callable) -> None:
        """The server's answer to a trainer's nonce: an HMAC of it keyed by the token, never the token itself."""
        nonce = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"))).get("nonce", "")
        if self.token and 0 < len(nonce) <= 64 and nonce.isalnum():
            status, body = 200, json.dumps({"proof": proof(self.token, b"server", nonce.encode()).decode()}).encode()
        else:
            status, body = 400, b'{"error": "GET /posttrain/proof?nonce=<up to 64 letters or digits>"}'
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    def _path(scope: Dict[str, Any]) -> str:
        return scope["path"].removeprefix(scope.get("root_path", "")).rstrip("/")

    def _allowed(self, scope: Dict[str, Any]) -> bool:
        path = self._path(scope)
        if path in OPEN_PATHS:
            return True
        headers = dict(scope.get("headers") or [])
        scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
        return scheme.lower() == b"bearer" and matches(given, self.token)
