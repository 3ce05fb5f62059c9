"""The ``vllm`` role's life without vLLM: a stand-in child process, the lease, and the trainers' health wait.

``serve`` must end the role (exit 0, child stopped) when training ends, when the trainers are gone and when
Slurm sends SIGTERM; only the child's own failure fails it. The trainers' side must say ``done`` only at a
clean end, and stop waiting for a server whose role has exited.
"""

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, List, Optional, Tuple

import pytest

from helpers import REPO, free_port, load_template
from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.schema import VLLM_HOST_VARIABLE, VLLM_TOKEN_VARIABLE
from posttrain.entrypoints import vllm_server
from posttrain.entrypoints.generation import role_lease, vllm_generation, vllm_token

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
LOOPBACK = vllm_server.LOOPBACK
TOKEN = "the-job-s-secret"


@pytest.fixture(autouse=True)
def job_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process of the job has its token (the component made it in the environment the job inherits)."""
    monkeypatch.setenv(VLLM_TOKEN_VARIABLE, TOKEN)


class Serving:
    """``serve`` in a thread, with the child it started."""

    def __init__(self, command: List[str], first_contact_s: float = 30, grace_s: float = 0) -> None:
        self.port = free_port()
        self.result: List[int] = []
        self.children: List[subprocess.Popen] = []
        popen = subprocess.Popen

        def recording(*args: Any, **kwargs: Any) -> subprocess.Popen:
            self.children.append(popen(*args, **kwargs))
            return self.children[-1]

        self.patch = pytest.MonkeyPatch()
        self.patch.setattr(vllm_server.subprocess, "Popen", recording)
        self.patch.setattr(vllm_server.signal, "signal", lambda *args: None)  # signals go to the main thread only
        self.thread = threading.Thread(
            target=lambda: self.result.append(
                vllm_server.serve(command, LOOPBACK, self.port, first_contact_s, grace_s)
            ),
            daemon=True,
        )
        self.thread.start()

    def connect(self, says: Optional[bytes] = None) -> socket.socket:
        """A connection to the lease that says ``says`` first, or by default proves it is the job's rank 0 (the
        trainers' own handshake)."""
        deadline = time.monotonic() + 10
        while True:
            try:
                connection = socket.create_connection((LOOPBACK, self.port), timeout=5)
                if says is None:
                    role_lease.handshake(connection, TOKEN)
                else:
                    connection.sendall(says)
                return connection
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def wait(self, timeout: float = 15) -> int:
        self.thread.join(timeout)
        self.patch.undo()
        assert self.result, "serve did not return"
        return self.result[0]

    @property
    def child_running(self) -> bool:
        return self.children[0].poll() is None


def test_done_on_the_lease_stops_the_server_and_the_role_exits_0() -> None:
    serving = Serving(SLEEPER)
    with serving.connect() as lease:
        time.sleep(0.5)
        assert serving.child_running
        lease.sendall(b"done")
    assert serving.wait() == 0
    assert not serving.child_running


@pytest.mark.parametrize(
    "says", [b"done", b"guess\n", b"guess\nwrong-proof\n", TOKEN.encode() + b"\n", b"", b"x" * 2048]
)
def test_a_stranger_on_the_lease_is_dropped_and_cannot_end_the_server(says: bytes, monkeypatch) -> None:
    monkeypatch.setattr(vllm_server, "HANDSHAKE_S", 1.0)
    serving = Serving(SLEEPER)
    with serving.connect(says=says) as stranger:  # no nonce, no proof, a wrong one, the token itself, silence, a flood
        stranger.settimeout(10)
        with contextlib.suppress(ConnectionResetError):  # closed with the flood unread: a reset
            while stranger.recv(1024):  # the role's proof of a nonce, at most: then dropped
                pass
    time.sleep(0.5)
    assert serving.child_running and not serving.result  # still serving, still waiting for the job's rank 0
    with serving.connect() as lease:
        lease.sendall(b"done")
    assert serving.wait() == 0


def test_a_stranger_s_slow_bytes_hold_the_handshake_no_longer_than_its_time(monkeypatch) -> None:
    monkeypatch.setattr(vllm_server, "HANDSHAKE_S", 1.0)
    serving = Serving(SLEEPER)
    started = time.monotonic()
    with serving.connect(says=b"x") as stranger:
        stranger.settimeout(0.3)
        while time.monotonic() - started < 5:  # a byte every 0.3 s, never a line
            try:
                if stranger.recv(16) == b"":
                    break
            except socket.timeout:
                stranger.sendall(b"x")
            except ConnectionResetError:
                break
    assert time.monotonic() - started < 2.5  # dropped after the handshake's second, not one per byte
    with serving.connect() as lease:
        lease.sendall(b"done")
    assert serving.wait() == 0


def test_strangers_knocking_do_not_keep_a_role_whose_trainers_never_came() -> None:
    serving = Serving(SLEEPER, first_contact_s=1)
    deadline = time.monotonic() + 10
    while not serving.result and time.monotonic() < deadline:  # a knock well within every accept's timeout
        with contextlib.suppress(OSError):  # one try each: refused before the role listens and after it stops
            with socket.create_connection((LOOPBACK, serving.port), timeout=1) as stranger:
                stranger.sendall(b"guess\n")
        time.sleep(0.2)
    assert serving.wait() == 0 and time.monotonic() < deadline


def test_a_trainer_gone_without_done_ends_the_role_at_once_without_restarts() -> None:
    serving = Serving(SLEEPER, grace_s=0)
    serving.connect().close()  # rank 0 crashed: the kernel closes its end
    assert serving.wait() == 0
    assert not serving.child_running


def test_a_restarted_trainer_within_the_grace_keeps_the_server() -> None:
    serving = Serving(SLEEPER, grace_s=10)
    serving.connect().close()
    time.sleep(1)
    assert serving.child_running  # waiting for torchrun's restarted rank 0
    with serving.connect() as lease:
        lease.sendall(b"done")
    assert serving.wait() == 0


def test_no_trainer_within_the_first_contact_time_ends_the_role() -> None:
    serving = Serving(SLEEPER, first_contact_s=1)
    assert serving.wait() == 0
    assert not serving.child_running


@pytest.mark.parametrize("ending, code", [("sys.exit(3)", 3), ("os.kill(os.getpid(), 9)", 1), ("sys.exit(0)", 1)])
def test_the_servers_own_end_fails_the_role_with_its_code_or_1(ending: str, code: int) -> None:
    serving = Serving([sys.executable, "-c", f"import os, sys, time; time.sleep(1); {ending}"])
    with serving.connect():
        assert serving.wait() == code


def test_sigterm_ends_the_role_with_0_and_stops_the_server(tmp_path: Path) -> None:
    port, pid_file = free_port(), tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    code = (
        f"from posttrain.entrypoints.vllm_server import serve; "
        f"serve([{sys.executable!r}, '-c', {child!r}], '127.0.0.1', {port}, 60, 0)"
    )
    role = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
    deadline = time.monotonic() + 20
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and role.poll() is None
        time.sleep(0.1)
    role.send_signal(signal.SIGTERM)
    assert role.wait(timeout=40) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


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
        with role_lease.lease(spec):
            role.join()
        held = accepted[0]
        # both proved they hold the job's token (the role holds no other lease), then done; the token never crossed
        assert b"".join(iter(lambda: held.recv(64), b"")) == b"done"
        held.close()
        role = threading.Thread(target=lambda: accepted.append(play_the_role(listener)))
        role.start()
        with pytest.raises(RuntimeError), role_lease.lease(spec):
            role.join()
            raise RuntimeError("a failing step")
        held = accepted[1]
        # no done, the lease just dropped: the role waits its grace, then stops
        assert b"".join(iter(lambda: held.recv(64), b"")) == b""
        assert not role_lease.role_exited()  # and this process holds no lease any more
        held.close()
        monkeypatch.setenv("RANK", "1")
        with role_lease.lease(spec):
            listener.settimeout(0.5)
            with pytest.raises(socket.timeout):
                listener.accept()  # other ranks hold none


def test_no_role_to_lease_from_is_one_line_naming_the_timeout(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(VLLM_HOST_VARIABLE, "localhost")
    monkeypatch.setattr(role_lease, "POLL_S", 0.2)
    with pytest.raises(SpecError, match=r"^training.vllm_server_timeout: the vllm role at localhost:\d+ did not"):
        with role_lease.lease(server_spec(tmp_path, free_port(), timeout_s=1)):
            pass


def test_role_exited_sees_the_role_close_its_end(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(VLLM_HOST_VARIABLE, "localhost")
    listener, port = listen()
    accepted: List[socket.socket] = []
    role = threading.Thread(target=lambda: accepted.append(play_the_role(listener)))
    role.start()
    with listener, role_lease.lease(server_spec(tmp_path, port)):
        role.join()
        role_side = accepted[0]
        assert not role_lease.role_exited()
        role_side.close()
        time.sleep(0.2)
        assert role_lease.role_exited()
    assert not role_lease.role_exited()  # no lease held any more


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_the_health_wait_answers_ends_at_a_gone_role_and_times_out_in_one_line(monkeypatch) -> None:
    monkeypatch.setattr(role_lease, "POLL_S", 0.2)
    check = vllm_generation._role_health_check(lambda client, total_timeout: "TRL's own check")
    server = http.server.HTTPServer(("localhost", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert check(SimpleNamespace(base_url=f"http://localhost:{server.server_port}"), 5) == "TRL's own check"
    finally:
        server.shutdown()
    nobody = SimpleNamespace(base_url=f"http://localhost:{free_port()}")
    monkeypatch.setattr(role_lease, "role_exited", lambda: True)
    started = time.monotonic()
    with pytest.raises(SpecError, match=r"^vllm role: the vLLM server exited before it answered"):
        check(nobody, 60)
    assert time.monotonic() - started < 10
    monkeypatch.setattr(role_lease, "role_exited", lambda: False)
    with pytest.raises(SpecError, match=r"^training.vllm_server_timeout: the vLLM server at .* within 1 s"):
        check(nobody, 1)


def test_trainers_without_the_job_s_token_stop_in_one_line_before_they_connect(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(VLLM_HOST_VARIABLE, "localhost")
    monkeypatch.delenv(VLLM_TOKEN_VARIABLE)
    with pytest.raises(
        SpecError, match=r"^the trainers: the job's vLLM token is missing \(it has none\); `torchx run`"
    ):
        with role_lease.lease(server_spec(tmp_path, free_port())):
            pass


@pytest.mark.parametrize("on_cuda", [False, True])
def test_the_server_listens_where_it_is_told_behind_the_job_s_guard(tmp_path: Path, on_cuda: bool) -> None:
    command = vllm_server.server_command(server_spec(tmp_path, 8123), "/m", "float32", 1, 1, on_cuda, "10.1.2.3")
    assert command[command.index("--host") + 1] == "10.1.2.3" and "0.0.0.0" not in command
    assert command[command.index("--middleware") + 1] == "posttrain.entrypoints.generation.vllm_token.RequireToken"
    assert TOKEN not in " ".join(command)  # the token reaches vLLM through the environment only


def network_address() -> str:
    """This host's address on its network (the route to a documentation address); a host without one skips."""
    try:
        return role_lease.route_address("203.0.113.5")
    except OSError as error:
        pytest.skip(f"this host has no route to another network ({error})")


def test_the_role_listens_where_the_trainers_connect_on_loopback_locally(monkeypatch) -> None:
    for name in (VLLM_HOST_VARIABLE, "SLURM_LAUNCH_NODE_IPADDR"):
        monkeypatch.delenv(name, raising=False)
    assert vllm_server.listen_address() == "127.0.0.1"  # local_cwd (the trainers' default too)
    monkeypatch.setenv(VLLM_HOST_VARIABLE, "localhost")  # a host's own name that is a loopback address (Debian's)
    here = network_address()
    monkeypatch.setenv("SLURM_LAUNCH_NODE_IPADDR", here)  # the trainers on this host: they resolve the loopback too
    assert vllm_server.listen_address() == "127.0.0.1"
    monkeypatch.setenv("SLURM_LAUNCH_NODE_IPADDR", "203.0.113.5")  # the trainers on another host
    assert vllm_server.listen_address() == here != "127.0.0.1"
    monkeypatch.setenv(VLLM_HOST_VARIABLE, "no-such-host.invalid")
    monkeypatch.setattr(vllm_server, "RESOLVE_S", 0.5)  # a DNS record that never comes
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

    class Client:  # as TRL's: a requests.Session as ``session``, a first request in __init__
        def __init__(self, base_url: str) -> None:
            self.session = requests.Session()
            self.session.get(f"{base_url}/v1/models")

    (tmp_path / "netrc").write_text("default login someone password theirs\n")  # requests applies it where it can
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    server = http.server.HTTPServer(("127.0.0.1", 0), Recording)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        Client.session = vllm_generation.TokenSession(TOKEN)  # type: ignore[attr-defined]
        Client(url).session.get(f"{url}/v1/completions")
        del Client.session  # a server the spec names: the client as TRL made it
        Client(url)
    finally:
        server.shutdown()
    assert seen[:2] == [f"Bearer {TOKEN}", f"Bearer {TOKEN}"]
    assert seen[2].startswith("Basic ")  # the .netrc's, which the job's token is not given way to


def test_on_gpus_trl_s_nccl_rendezvous_listens_toward_the_role_only() -> None:
    def trl_s_get_ip() -> str:  # TRL's: the address of the default route
        return "192.0.2.99"

    toward = vllm_generation._toward("127.0.0.1", trl_s_get_ip)
    assert toward() == "127.0.0.1"  # local_cwd: the role is on this host
    assert vllm_generation._toward("203.0.113.5", trl_s_get_ip)() == network_address()
    assert vllm_generation._unwrapped(toward) is trl_s_get_ip  # the next job's prepare starts from TRL's


def test_strangers_holding_connections_open_do_not_keep_the_trainers_out(monkeypatch) -> None:
    """Silent connections each cost their own HANDSHAKE_S, side by side: the job's rank 0 is let in at once."""
    serving = Serving(SLEEPER)
    strangers = [serving.connect(says=b"") for _ in range(30)]  # silent
    time.sleep(0.2)
    started = time.monotonic()
    with serving.connect() as lease:
        assert time.monotonic() - started < 2  # not 30 strangers x 5 s
        lease.sendall(b"done")
    assert serving.wait() == 0
    for stranger in strangers:
        stranger.close()


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
            with role_lease.lease(server_spec(tmp_path, port)):
                pass
        thread.join()
        squatter[0].settimeout(5)
        heard = b"".join(iter(lambda: squatter[0].recv(64), b""))
        assert TOKEN.encode() not in heard and heard.count(b"\n") <= 1  # a nonce at most, never the token
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
    assert all(authorization is None for _, authorization in seen)  # nothing of the token went to it
