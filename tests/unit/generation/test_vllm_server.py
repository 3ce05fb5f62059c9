"""The trainers' side of the ``vllm`` role, in process: rank 0 holds the lease and says ``done`` only at a clean
end, sees the role exit, and sends the job's token only to the job's own server, where it listens. (``serve`` with a
stand-in child process, and the health wait: ``tests/integration/test_vllm_server.py``.)"""

import http.server
import json
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, List, Optional, Tuple

import pytest

from helpers import JOB_TOKEN as TOKEN
from helpers import free_port, load_template
from posttrain.components.spec.generation import VLLM_HOST_VARIABLE, VLLM_TOKEN_VARIABLE
from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints import vllm_server
from posttrain.entrypoints.generation import role_lease, vllm_generation, vllm_token

pytestmark = pytest.mark.usefixtures("job_token")


def server_spec(tmp_path: Path, port: int, timeout_s: int = 5) -> Any:
    raw = load_template("grpo/tiny-vllm-server.yaml")
    raw["training"].update(output_dir=str(tmp_path), vllm_server_port=port, vllm_server_timeout=timeout_s)
    return validate(raw)


def listen() -> Tuple[socket.socket, int]:
    """A listener where rank 0 holds its lease, and the server port that puts the lease there.

    The lease's port is bound first (a free port, then the one after it, could be taken in between).
    """
    listener = socket.create_server(("localhost", 0))
    listener.settimeout(10)
    lease = listener.getsockname()[1]
    assert role_lease.lease_port(lease - 1) == lease
    return listener, lease - 1


def play_the_role(listener: socket.socket, answer: Optional[bytes] = None) -> socket.socket:
    """The role's side of one lease handshake, with the job's token (or ``answer`` in its place: a squatter)."""
    held, _ = listener.accept()
    nonce = held.makefile("rb").readline().strip()
    if answer is not None:
        held.sendall(answer)
        return held
    held.sendall(vllm_token.proof(TOKEN, b"role", nonce) + b" rolenonce\n")
    assert held.makefile("rb").readline().strip() == vllm_token.proof(TOKEN, b"trainer", b"rolenonce")
    return held


def test_rank0_holds_the_lease_and_says_done_only_at_a_clean_end(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(VLLM_HOST_VARIABLE, "localhost")
    monkeypatch.setenv("RANK", "0")
    listener, port = listen()
    spec = server_spec(tmp_path, port)
    with listener:
        role = threading.Thread(target=lambda: accepted.append(play_the_role(listener)))
        accepted: List[socket.socket] = []
        role.start()
        with role_lease.lease(spec.training):
            role.join()
        held = accepted[0]
        # both proved they hold the job's token (the role holds no other lease), then done; the token never crossed
        assert b"".join(iter(lambda: held.recv(64), b"")) == b"done"
        held.close()
        role = threading.Thread(target=lambda: accepted.append(play_the_role(listener)))
        role.start()
        with pytest.raises(RuntimeError), role_lease.lease(spec.training):
            role.join()
            raise RuntimeError("a failing step")
        held = accepted[1]
        # no done, the lease just dropped: the role waits its grace, then stops
        assert b"".join(iter(lambda: held.recv(64), b"")) == b""
        # and this process holds no lease any more
        assert not role_lease.role_exited()
        held.close()
        monkeypatch.setenv("RANK", "1")
        with role_lease.lease(spec.training):
            listener.settimeout(0.5)
            with pytest.raises(socket.timeout):
                # other ranks hold none
                listener.accept()


def test_no_role_to_lease_from_is_one_line_naming_the_timeout(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(VLLM_HOST_VARIABLE, "localhost")
    monkeypatch.setattr(role_lease, "POLL_S", 0.2)
    with pytest.raises(SpecError, match=r"^training.vllm_server_timeout: the vllm role at localhost:\d+ did not"):
        with role_lease.lease(server_spec(tmp_path, free_port(), timeout_s=1).training):
            pass


def test_role_exited_sees_the_role_close_its_end(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(VLLM_HOST_VARIABLE, "localhost")
    listener, port = listen()
    accepted: List[socket.socket] = []
    role = threading.Thread(target=lambda: accepted.append(play_the_role(listener)))
    role.start()
    with listener, role_lease.lease(server_spec(tmp_path, port).training):
        role.join()
        role_side = accepted[0]
        assert not role_lease.role_exited()
        role_side.close()
        time.sleep(0.2)
        assert role_lease.role_exited()
    # no lease held any more
    assert not role_lease.role_exited()


def test_trainers_without_the_job_s_token_stop_in_one_line_before_they_connect(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(VLLM_HOST_VARIABLE, "localhost")
    monkeypatch.delenv(VLLM_TOKEN_VARIABLE)
    with pytest.raises(
        SpecError, match=r"^the trainers: the job's vLLM token is missing \(it has none\); `torchx run`"
    ):
        with role_lease.lease(server_spec(tmp_path, free_port()).training):
            pass


@pytest.mark.parametrize("on_cuda", [False, True])
def test_the_server_listens_where_it_is_told_behind_the_job_s_guard(tmp_path: Path, on_cuda: bool) -> None:
    spec = server_spec(tmp_path, 8123)
    command = vllm_server.server_command(
        spec.training, spec.model, "/m", "float32", tensor_parallel=1, data_parallel=1, on_cuda=on_cuda, host="10.1.2.3"
    )
    assert command[command.index("--host") + 1] == "10.1.2.3" and "0.0.0.0" not in command
    assert command[command.index("--middleware") + 1] == "posttrain.entrypoints.generation.vllm_token.RequireToken"
    # torch.compile only where it pays (vllm_generation.runs_eagerly)
    assert ("--enforce-eager" in command) is not on_cuda
    # the token reaches vLLM through the environment only
    assert TOKEN not in " ".join(command)


def network_address() -> str:
    """This host's address on its network (the route to a documentation address); a host without one skips."""
    try:
        return role_lease.route_address("203.0.113.5")
    except OSError as error:
        pytest.skip(f"this host has no route to another network ({error})")


def test_the_role_listens_where_the_trainers_connect_on_loopback_locally(monkeypatch) -> None:
    for name in (VLLM_HOST_VARIABLE, "SLURM_LAUNCH_NODE_IPADDR"):
        monkeypatch.delenv(name, raising=False)
    # local_cwd (the trainers' default too)
    assert vllm_server.listen_address() == "127.0.0.1"
    # a host's own name that is a loopback address (Debian's)
    monkeypatch.setenv(VLLM_HOST_VARIABLE, "localhost")
    here = network_address()
    # the trainers on this host: they resolve the loopback too
    monkeypatch.setenv("SLURM_LAUNCH_NODE_IPADDR", here)
    assert vllm_server.listen_address() == "127.0.0.1"
    # the trainers on another host
    monkeypatch.setenv("SLURM_LAUNCH_NODE_IPADDR", "203.0.113.5")
    assert vllm_server.listen_address() == here != "127.0.0.1"
    monkeypatch.setenv(VLLM_HOST_VARIABLE, "no-such-host.invalid")
    # a DNS record that never comes
    monkeypatch.setattr(vllm_server, "RESOLVE_S", 0.5)
    monkeypatch.setattr(vllm_server, "POLL_S", 0.1)
    with pytest.raises(SpecError, match=r"^vllm role: no address of no-such-host.invalid to listen on \("):
        vllm_server.listen_address()


def test_the_trainers_client_sends_the_token_to_the_job_s_role_only(tmp_path: Path, monkeypatch) -> None:
    """What ``prepare`` does to TRL's ``VLLMClient`` (which needs vLLM: the vLLM tests run it against the role)."""
    import requests

    seen: List[str] = []

    class Recording(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    # as TRL's: a requests.Session as ``session``, a first request in __init__
    class Client:
        def __init__(self, base_url: str) -> None:
            self.session = requests.Session()
            self.session.get(f"{base_url}/v1/models")

    # requests applies it where it can
    (tmp_path / "netrc").write_text("default login someone password theirs\n")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    server = http.server.HTTPServer(("127.0.0.1", 0), Recording)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        Client.session = vllm_generation.TokenSession(TOKEN)  # type: ignore[attr-defined]
        Client(url).session.get(f"{url}/v1/completions")
        # a server the spec names: the client as TRL made it
        del Client.session
        Client(url)
    finally:
        server.shutdown()
    assert seen[:2] == [f"Bearer {TOKEN}", f"Bearer {TOKEN}"]
    # the .netrc's, which the job's token is not given way to
    assert seen[2].startswith("Basic ")


def test_on_gpus_trl_s_nccl_rendezvous_listens_toward_the_role_only() -> None:
    # TRL's: the address of the default route
    def trl_s_get_ip() -> str:
        return "192.0.2.99"

    toward = vllm_generation._toward("127.0.0.1", trl_s_get_ip)
    # local_cwd: the role is on this host
    assert toward() == "127.0.0.1"
    assert vllm_generation._toward("203.0.113.5", trl_s_get_ip)() == network_address()
    # the next job's prepare starts from TRL's
    assert vllm_generation._unwrapped(toward) is trl_s_get_ip


@pytest.mark.parametrize("answer", [b"ok\n", b"0" * 64 + b" nonce\n"])
def test_trainers_stop_in_one_line_at_a_squatter_on_the_role_s_port_and_send_it_nothing(
    tmp_path: Path, monkeypatch, answer: bytes
) -> None:
    monkeypatch.setenv(VLLM_HOST_VARIABLE, "localhost")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(vllm_server, "HANDSHAKE_S", 1.0)
    listener, port = listen()
    with listener:
        squatter: List[socket.socket] = []
        thread = threading.Thread(target=lambda: squatter.append(play_the_role(listener, answer)))
        thread.start()
        with pytest.raises(SpecError, match=r"^vllm role: what listens at 127.0.0.1:\d+ did not prove it holds"):
            with role_lease.lease(server_spec(tmp_path, port).training):
                pass
        thread.join()
        squatter[0].settimeout(5)
        heard = b"".join(iter(lambda: squatter[0].recv(64), b""))
        # a nonce at most, never the token
        assert TOKEN.encode() not in heard and heard.count(b"\n") <= 1
        squatter[0].close()


@pytest.mark.parametrize("proves", [True, False])
def test_the_trainers_send_the_token_only_to_a_server_that_proves_it_holds_it(monkeypatch, proves: bool) -> None:
    """A squatter on the role's port answers /health as vLLM does: the trainers ask it for a proof first (without
    the token), and stop in one line before TRL's client sends it anything."""
    monkeypatch.setenv(VLLM_HOST_VARIABLE, "localhost")
    seen: List[Tuple[str, Optional[str]]] = []

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Authorization")))
            nonce = self.path.partition("nonce=")[2].encode()
            if self.path.startswith(vllm_token.PROOF_PATH):
                made = vllm_token.proof(TOKEN if proves else "a-guess", b"server", nonce).decode()
                body = json.dumps({"proof": made}).encode()
            else:
                body = b"{}"
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    check = vllm_generation._role_health_check(lambda client, total_timeout: "TRL's own check")
    server = http.server.HTTPServer(("localhost", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://localhost:{server.server_port}"
    try:
        if proves:
            assert check(SimpleNamespace(base_url=url), 5) == "TRL's own check"
        else:
            with pytest.raises(SpecError, match=rf"^vllm role: the server at {url} did not prove it holds the job"):
                check(SimpleNamespace(base_url=url), 5)
    finally:
        server.shutdown()
    assert [path.partition("?")[0] for path, _ in seen] == ["/health", vllm_token.PROOF_PATH]
    # nothing of the token went to it
    assert all(authorization is None for _, authorization in seen)
