"""A push of the weights into the ``vllm`` role is bounded by ``generation.weight_sync_timeout_s`` however it hangs
(``run_ahead.Turns.deadline``): in a process of its own, a push blocked where nothing raises ends the process in one
line, left in torchrun's error file. The hang is a request to a server that takes the connection and never answers,
as a stopped vLLM server does (or an NCCL transfer that never ends: nothing interrupts either)."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from posttrain.components.spec.schema import TrainingGeneration
from posttrain.entrypoints.generation import run_ahead

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
    monkeypatch.setattr(run_ahead, "stop_now", stopped.append)
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
