"""What the trainers ask of vLLM is bounded in time however it hangs: a push of the weights into the ``vllm`` role by
``generation.weight_sync_timeout_s`` (``run_ahead.Turns.deadline``), a generation by ``generation.generate_timeout_s``
(``run_ahead.bound_generation``). In a process of its own, each blocked where nothing raises ends the process in one
line, left in torchrun's error file. The hangs are real requests: to a server that takes the connection and never
answers, as a stopped vLLM server does (or an NCCL transfer that never ends: nothing interrupts either), and through
TRL's own client to a server whose ``/health`` answers 200 and whose generation never does, as a wedged engine's (a request as TRL's client sends it: in this
environment TRL's client refuses to start without vLLM).
"""

import http.server
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from posttrain.components.spec.schema import TrainingGeneration
from posttrain.entrypoints.generation import run_ahead
from posttrain.entrypoints.job import error_file

PUSH = """
import sys
from types import SimpleNamespace

import requests

from posttrain.components.spec.schema import TrainingGeneration
from posttrain.entrypoints.generation.run_ahead import Lockstep

base_url = sys.argv[1]
trainer = SimpleNamespace(
    accelerator=SimpleNamespace(is_main_process=True),
    vllm_generation=SimpleNamespace(vllm_client=SimpleNamespace(base_url=base_url)),
)
turns = Lockstep(trainer, TrainingGeneration(weight_sync_timeout_s=1))
with turns.deadline(7):
    requests.post(f"{base_url}/update_weights", json={})
print("the push returned", flush=True)
"""


def test_a_push_that_never_ends_ends_the_process_in_one_line_within_its_timeout(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    with socket.create_server(("127.0.0.1", 0)) as silent:
        base_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        ended = subprocess.run(
            [sys.executable, "-c", PUSH, base_url],
            env={"TORCHELASTIC_ERROR_FILE": str(error_file), "HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - started
    line = (
        f"posttrain: vllm role: the server at {base_url} did not take the weights of step 7 within 1 s "
        "(generation.weight_sync_timeout_s); see its log"
    )
    assert ended.returncode == 2 and ended.stdout == "", (ended.returncode, ended.stdout, ended.stderr)
    assert ended.stderr.splitlines() == [line], ended.stderr
    assert json.loads(error_file.read_text())["message"]["message"] == line
    # the interpreter's start and imports, then the second of the deadline
    assert took < 60, took


def test_a_push_in_time_or_one_that_raises_leaves_the_process_to_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped = []
    monkeypatch.setattr(error_file, "stop_now", stopped.append)
    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(is_main_process=True),
        vllm_generation=SimpleNamespace(vllm_client=SimpleNamespace(base_url="http://127.0.0.1:1")),
    )
    turns = run_ahead.Lockstep(trainer, TrainingGeneration(weight_sync_timeout_s=0.2))
    with turns.deadline(3):
        pass
    with pytest.raises(ConnectionError), turns.deadline(4):
        raise ConnectionError("refused")
    # past both deadlines, neither timer ended the process: they were stopped
    time.sleep(0.5)
    assert stopped == []


GENERATE = """
import sys
from types import SimpleNamespace

import requests

from posttrain.components.spec.schema import TrainingGeneration
from posttrain.entrypoints.generation.run_ahead import bound_generation

client = SimpleNamespace(base_url=sys.argv[1], session=requests.Session())
generation = SimpleNamespace(mode="server", vllm_client=client)
# as TRL's client asks the server (trl/generation/vllm_client.py, generate: its session, no timeout), on rank 0
generation.generate = lambda prompts: client.session.post(
    f"{client.base_url}/v1/completions", json={"prompt": prompts, "n": 2, "max_tokens": 8}
)
trainer = SimpleNamespace(
    vllm_generation=generation,
    accelerator=SimpleNamespace(is_main_process=True, process_index=0),
    args=SimpleNamespace(ddp_timeout=300),
    state=SimpleNamespace(global_step=6),
)
bound_generation(trainer, TrainingGeneration(generate_timeout_s=2))
trainer.vllm_generation.generate(["hello"])
print("the generation returned", flush=True)
"""


class WedgedEngine(http.server.BaseHTTPRequestHandler):
    """A vLLM server whose process answers /health and whose engine never generates."""

    def do_GET(self) -> None:
        self.send_response(200 if self.path.rstrip("/") == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        time.sleep(3600)

    def log_message(self, *args: object) -> None:
        pass


def test_a_generation_the_server_never_answers_while_its_health_does_ends_the_process_within_its_timeout(
    tmp_path: Path,
) -> None:
    error_file_path = tmp_path / "error.json"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), WedgedEngine)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base_url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        started = time.monotonic()
        ended = subprocess.run(
            [sys.executable, "-c", GENERATE, base_url],
            env={
                "TORCHELASTIC_ERROR_FILE": str(error_file_path),
                "HF_HOME": str(tmp_path / "hf"),
                "PATH": "/usr/bin:/bin",
            },
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - started
    finally:
        server.shutdown()
    line = (
        f"posttrain: vLLM: the server at {base_url} did not answer the generation of step 7 within 2 s "
        "(generation.generate_timeout_s); see its log"
    )
    assert ended.returncode == 2 and "returned" not in ended.stdout, (ended.returncode, ended.stdout, ended.stderr)
    assert ended.stderr.splitlines()[-1] == line, ended.stderr
    assert json.loads(error_file_path.read_text())["message"]["message"] == line
    assert took < 60, took


def test_an_unset_generation_timeout_ends_before_the_other_processes_wait_for_the_samples() -> None:
    assert TrainingGeneration().generate_timeout(300) == 270
    assert TrainingGeneration(generate_timeout_s=40).generate_timeout(300) == 40
