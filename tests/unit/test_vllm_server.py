"""The ``vllm`` role's life without vLLM: a stand-in child process, the lease, and the trainers' health wait.

``serve`` must end the role (exit 0, child stopped) when training ends, when the trainers are gone and when
Slurm sends SIGTERM; only the child's own failure fails it. The trainers' side must say ``done`` only at a
clean end, and stop waiting for a server whose role has exited.
"""

import contextlib
import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, List, Tuple

import pytest

from helpers import REPO, free_port, load_template
from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.schema import VLLM_HOST_VARIABLE
from posttrain.entrypoints import vllm_generation, vllm_server, vllm_token

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
TOKEN = "the-job-s-secret"


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
        self.patch.setenv(vllm_token.TOKEN_ENV, TOKEN)  # the job's: every process of it has it
        self.patch.setattr(vllm_server.subprocess, "Popen", recording)
        self.patch.setattr(vllm_server.signal, "signal", lambda *args: None)  # signals go to the main thread only
        self.thread = threading.Thread(
            target=lambda: self.result.append(vllm_server.serve(command, self.port, first_contact_s, grace_s)),
            daemon=True,
        )
        self.thread.start()

    def connect(self, says: bytes = TOKEN.encode() + b"\n") -> socket.socket:
        """A connection to the lease that says ``says`` first (the job's token, by default)."""
        deadline = time.monotonic() + 10
        while True:
            try:
                connection = socket.create_connection(("localhost", self.port), timeout=5)
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


@pytest.mark.parametrize("says", [b"done", b"guess\n", b"", b"x" * 2048])
def test_a_stranger_on_the_lease_is_dropped_and_cannot_end_the_server(says: bytes) -> None:
    serving = Serving(SLEEPER)
    with serving.connect(says=says) as stranger:  # no token, a wrong one, silence, a flood
        stranger.settimeout(10)
        with contextlib.suppress(ConnectionResetError):  # closed with the flood unread: a reset
            assert stranger.recv(16) == b""  # dropped
    time.sleep(0.5)
    assert serving.child_running and not serving.result  # still serving, still waiting for the job's rank 0
    with serving.connect() as lease:
        lease.sendall(b"done")
    assert serving.wait() == 0


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
        f"serve([{sys.executable!r}, '-c', {child!r}], {port}, 60, 0)"
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
    assert vllm_server.lease_port(lease - 1) == lease
    return listener, lease - 1


def test_rank0_holds_the_lease_and_says_done_only_at_a_clean_end(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(VLLM_HOST_VARIABLE, "localhost")
    monkeypatch.setenv("RANK", "0")
    listener, port = listen()
    spec = server_spec(tmp_path, port)
    monkeypatch.setenv(vllm_token.TOKEN_ENV, TOKEN)
    with listener:
        with vllm_server.lease(spec):
            held, _ = listener.accept()
        # the job's token first (the role holds no other lease), then done
        assert b"".join(iter(lambda: held.recv(64), b"")) == TOKEN.encode() + b"\ndone"
        held.close()
        with pytest.raises(RuntimeError), vllm_server.lease(spec):
            held, _ = listener.accept()
            raise RuntimeError("a failing step")
        assert (
            b"".join(iter(lambda: held.recv(64), b"")) == TOKEN.encode() + b"\n"
        )  # no done  # dropped: the role waits its grace, then stops
        assert not vllm_server.role_exited()  # and this process holds no lease any more
        held.close()
        monkeypatch.setenv("RANK", "1")
        with vllm_server.lease(spec):
            listener.settimeout(0.5)
            with pytest.raises(socket.timeout):
                listener.accept()  # other ranks hold none


def test_no_role_to_lease_from_is_one_line_naming_the_timeout(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(VLLM_HOST_VARIABLE, "localhost")
    monkeypatch.setattr(vllm_server, "POLL_S", 0.2)
    with pytest.raises(SpecError, match=r"^training.vllm_server_timeout: the vllm role at localhost:\d+ did not"):
        with vllm_server.lease(server_spec(tmp_path, free_port(), timeout_s=1)):
            pass


def test_role_exited_sees_the_role_close_its_end(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(VLLM_HOST_VARIABLE, "localhost")
    listener, port = listen()
    with listener, vllm_server.lease(server_spec(tmp_path, port)):
        role_side, _ = listener.accept()
        assert not vllm_server.role_exited()
        role_side.close()
        time.sleep(0.2)
        assert vllm_server.role_exited()
    assert not vllm_server.role_exited()  # no lease held any more


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_the_health_wait_answers_ends_at_a_gone_role_and_times_out_in_one_line(monkeypatch) -> None:
    monkeypatch.setattr(vllm_server, "POLL_S", 0.2)
    check = vllm_generation._role_health_check(lambda client, total_timeout: "TRL's own check")
    server = http.server.HTTPServer(("localhost", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert check(SimpleNamespace(base_url=f"http://localhost:{server.server_port}"), 5) == "TRL's own check"
    finally:
        server.shutdown()
    nobody = SimpleNamespace(base_url=f"http://localhost:{free_port()}")
    monkeypatch.setattr(vllm_server, "role_exited", lambda: True)
    started = time.monotonic()
    with pytest.raises(SpecError, match=r"^vllm role: the vLLM server exited before it answered"):
        check(nobody, 60)
    assert time.monotonic() - started < 10
    monkeypatch.setattr(vllm_server, "role_exited", lambda: False)
    with pytest.raises(SpecError, match=r"^training.vllm_server_timeout: the vLLM server at .* within 1 s"):
        check(nobody, 1)
