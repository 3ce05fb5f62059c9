"""The ``vllm`` role's ``serve`` with a stand-in child process: it ends the role (exit 0, child stopped) when training
ends, when the trainers are gone and on SIGTERM; only the child's own failure fails it; strangers on the lease neither
end it nor keep the trainers out. And the trainers' health wait ends at a gone role.
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
from typing import Any, List, Optional

import pytest

from helpers import JOB_TOKEN as TOKEN
from helpers import REPO, free_port
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints import vllm_server
from posttrain.entrypoints.generation import role_lease, vllm_generation

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


LOOPBACK = vllm_server.LOOPBACK


pytestmark = pytest.mark.usefixtures("job_token")


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
        # signals go to the main thread only
        self.patch.setattr(vllm_server.signal, "signal", lambda *args: None)
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
    # no nonce, no proof, a wrong one, the token itself, silence, a flood
    with serving.connect(says=says) as stranger:
        stranger.settimeout(10)
        # closed with the flood unread: a reset
        with contextlib.suppress(ConnectionResetError):
            # the role's proof of a nonce, at most: then dropped
            while stranger.recv(1024):
                pass
    time.sleep(0.5)
    # still serving, still waiting for the job's rank 0
    assert serving.child_running and not serving.result
    with serving.connect() as lease:
        lease.sendall(b"done")
    assert serving.wait() == 0


def test_a_stranger_s_slow_bytes_hold_the_handshake_no_longer_than_its_time(monkeypatch) -> None:
    monkeypatch.setattr(vllm_server, "HANDSHAKE_S", 1.0)
    serving = Serving(SLEEPER)
    started = time.monotonic()
    with serving.connect(says=b"x") as stranger:
        stranger.settimeout(0.3)
        # a byte every 0.3 s, never a line
        while time.monotonic() - started < 5:
            try:
                if stranger.recv(16) == b"":
                    break
            except socket.timeout:
                stranger.sendall(b"x")
            except ConnectionResetError:
                break
    # dropped after the handshake's second, not one per byte
    assert time.monotonic() - started < 2.5
    with serving.connect() as lease:
        lease.sendall(b"done")
    assert serving.wait() == 0


def test_strangers_knocking_do_not_keep_a_role_whose_trainers_never_came() -> None:
    serving = Serving(SLEEPER, first_contact_s=1)
    deadline = time.monotonic() + 10
    # a knock well within every accept's timeout
    while not serving.result and time.monotonic() < deadline:
        # one try each: refused before the role listens and after it stops
        with contextlib.suppress(OSError):
            with socket.create_connection((LOOPBACK, serving.port), timeout=1) as stranger:
                stranger.sendall(b"guess\n")
        time.sleep(0.2)
    assert serving.wait() == 0 and time.monotonic() < deadline


def test_a_trainer_gone_without_done_ends_the_role_at_once_without_restarts() -> None:
    serving = Serving(SLEEPER, grace_s=0)
    # rank 0 crashed: the kernel closes its end
    serving.connect().close()
    assert serving.wait() == 0
    assert not serving.child_running


def test_a_restarted_trainer_within_the_grace_keeps_the_server() -> None:
    serving = Serving(SLEEPER, grace_s=10)
    serving.connect().close()
    time.sleep(1)
    # waiting for torchrun's restarted rank 0
    assert serving.child_running
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


def test_strangers_holding_connections_open_do_not_keep_the_trainers_out(monkeypatch) -> None:
    """Silent connections each cost their own HANDSHAKE_S, side by side: the job's rank 0 is let in at once."""
    serving = Serving(SLEEPER)
    # silent
    strangers = [serving.connect(says=b"") for _ in range(30)]
    time.sleep(0.2)
    started = time.monotonic()
    with serving.connect() as lease:
        # not 30 strangers x 5 s
        assert time.monotonic() - started < 2
        lease.sendall(b"done")
    assert serving.wait() == 0
    for stranger in strangers:
        stranger.close()
