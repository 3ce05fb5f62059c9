"""The vllm role's guard, as vLLM's server runs it (an ASGI middleware): every path but /health needs the token."""

import asyncio
import json
from typing import Any, Dict, List, Optional

import pytest

from helpers import JOB_TOKEN as TOKEN
from posttrain.components.spec.generation import VLLM_TOKEN_PATH_VARIABLE, VLLM_TOKEN_VARIABLE
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.generation import vllm_token


def answer(
    path: str, authorization: Optional[str] = None, kind: str = "http", query: bytes = b""
) -> List[Dict[str, Any]]:
    """What the guarded server sends back for one request: the app's own answer, or the guard's."""
    sent: List[Dict[str, Any]] = []

    async def app(scope: Dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "app", "path": scope["path"]})

    async def send(message: Dict[str, Any]) -> None:
        sent.append(message)

    headers = [] if authorization is None else [(b"authorization", authorization.encode())]
    scope = {"type": kind, "path": path, "headers": headers, "method": "POST", "query_string": query}
    asyncio.run(vllm_token.RequireToken(app)(scope, None, send))
    return sent


@pytest.mark.parametrize("path", ["/v1/models", "/v1/completions", "/collective_rpc", "/reset_prefix_cache", "/x"])
@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {TOKEN}", "Bearer ", TOKEN])
def test_every_path_but_health_refuses_a_request_without_the_token(
    job_token: None, path: str, authorization: str
) -> None:
    start, body = answer(path, authorization)
    assert start["status"] == 401 and b"Unauthorized" in body["body"]


@pytest.mark.parametrize("path", ["/v1/models", "/collective_rpc", "/health"])
def test_the_job_s_requests_and_health_get_through(job_token: None, path: str) -> None:
    assert answer(path, f"Bearer {TOKEN}") == [{"type": "app", "path": path}]
    # the trainers' wait for the server
    assert answer("/health") == [{"type": "app", "path": "/health"}]


def test_a_websocket_without_the_token_is_closed_and_lifespan_passes(job_token: None) -> None:
    assert answer("/v1/realtime", kind="websocket") == [{"type": "websocket.close", "code": 1008}]
    assert answer("/", kind="lifespan") == [{"type": "app", "path": "/"}]


def test_without_a_token_in_the_job_everything_but_health_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VLLM_TOKEN_VARIABLE, raising=False)
    assert answer("/v1/models", "Bearer ")[0]["status"] == 401
    assert answer("/health") == [{"type": "app", "path": "/health"}]
    assert not vllm_token.matches(b"", None)


def test_the_token_comes_from_the_environment_or_the_file_it_names(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VLLM_TOKEN_VARIABLE, raising=False)
    monkeypatch.setenv(VLLM_TOKEN_PATH_VARIABLE, str(tmp_path / "token"))
    with pytest.raises(SpecError, match=rf"^vllm role: the job's vLLM token is missing \({VLLM_TOKEN_PATH_VARIABLE}="):
        # no such file
        vllm_token.required_token("vllm role")
    (tmp_path / "token").write_text("\n")
    assert vllm_token.job_token() is None
    # a file on a volume the job mounts (Kubernetes)
    (tmp_path / "token").write_text(f"{TOKEN}\n")
    assert vllm_token.required_token("vllm role") == TOKEN
    monkeypatch.setenv(VLLM_TOKEN_VARIABLE, "inherited")
    assert vllm_token.job_token() == "inherited"


def test_the_server_proves_it_holds_the_token_without_sending_it(job_token: None) -> None:
    """Asked with no token at all: an HMAC of the asker's nonce, which only the token's holder can make."""
    start, body = answer(vllm_token.PROOF_PATH, query=b"nonce=abc123")
    assert start["status"] == 200
    assert json.loads(body["body"]) == {"proof": vllm_token.proof(TOKEN, b"server", b"abc123").decode()}
    assert TOKEN.encode() not in body["body"]
    for bad in (b"", b"nonce=", b"nonce=a%20b", b"nonce=" + b"a" * 65):
        assert answer(vllm_token.PROOF_PATH, query=bad)[0]["status"] == 400


def test_a_server_without_the_token_proves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VLLM_TOKEN_VARIABLE, raising=False)
    assert answer(vllm_token.PROOF_PATH, query=b"nonce=abc123")[0]["status"] == 400
