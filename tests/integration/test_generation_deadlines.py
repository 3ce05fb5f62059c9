"""What the trainers ask of vLLM is bounded in time however it hangs: a push of the weights into the ``vllm`` role by
``generation.weight_sync_timeout_s`` (``turns.Turns.deadline``), a step's generation by
``generation.generate_timeout_s`` (``turns.bound_generation`` in lockstep and colocated, ``RunAhead`` ahead of
training), an evaluation's vLLM sampling by its ``generation.vllm_timeout_s`` (``evaluation.sampling``). In a
process of its own, each blocked where nothing raises ends the process in one line, left in torchrun's error file.

The hangs are real: a server that takes the connection and never answers, as a stopped vLLM server does (or an NCCL
transfer that never ends: nothing interrupts either); a server whose ``/health`` answers 200 and whose generation
never does, as a wedged engine's, asked by TRL's own ``VLLMClient`` (which refuses to start where vLLM is not
installed, as here: only that check is lifted); a sampling process whose engine never answers. vLLM itself is in
tests/e2e/test_vllm.py (-m vllm).
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
from typing import Iterator, List, Tuple

import psutil
import pytest

from posttrain.components.spec.generation import TrainingGeneration
from posttrain.entrypoints.generation.turns import Lockstep
from posttrain.entrypoints.process import error_file

PUSH = """
import sys
from types import SimpleNamespace

import requests

from posttrain.components.spec.generation import TrainingGeneration
from posttrain.entrypoints.generation.turns import Lockstep

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
    turns = Lockstep(trainer, TrainingGeneration(weight_sync_timeout_s=0.2))
    with turns.deadline(3):
        pass
    with pytest.raises(ConnectionError), turns.deadline(4):
        raise ConnectionError("refused")
    # past both deadlines, neither timer ended the process: they were stopped
    time.sleep(0.5)
    assert stopped == []


# a step's generation as rank 0 asks the vllm role for it, through TRL's own VLLMClient, in lockstep (TRL's
# VLLMGeneration.generate, bounded) or ahead of training (RunAhead's generator, the trainer waiting for its batch)
ROLE = """
import sys
import threading
from types import SimpleNamespace

import requests
from trl.generation import vllm_client

from posttrain.components.spec.generation import TrainingGeneration
from posttrain.entrypoints.generation import run_ahead
from posttrain.entrypoints.generation.turns import bound_generation
from posttrain.entrypoints.process.ending import ends_in_one_line

# TRL's client refuses to start where vLLM is not installed; nothing else of it is changed
vllm_client.is_vllm_available = lambda *args, **kwargs: True
client = vllm_client.VLLMClient(base_url=sys.argv[1])
# what TRL's VLLMGeneration holds of the spec, and reads for its request (GRPO's defaults)
sampling = dict(repetition_penalty=1.0, temperature=1.0, top_p=1.0, top_k=0, min_p=None, max_completion_length=8)
generation = SimpleNamespace(mode="server", vllm_client=client, logprobs=0, structured_outputs_regex=None,
                             generation_kwargs={}, **sampling)
trainer = SimpleNamespace(
    vllm_generation=generation,
    accelerator=SimpleNamespace(is_main_process=True, process_index=0),
    args=SimpleNamespace(ddp_timeout=300),
    state=SimpleNamespace(global_step=6),
    num_generations=2,
    # the data's prompts are their tokens here
    _tokenize_prompts=lambda prompts: (prompts, None, None),
)
schedule = TrainingGeneration(max_lag=int(sys.argv[2]), generate_timeout_s=2)
with ends_in_one_line():
    if schedule.runs_ahead:
        turns = run_ahead.RunAhead(trainer, schedule)
        # the role holds the weights of step 6: the generator asks it for the samples of step 7 at once
        turns.session, turns.role_version, turns.first_step = requests.Session(), 6, 6
        threading.Thread(target=turns._generate_guarded, daemon=True).start()
        turns._ask([{"prompt": [1, 2, 3]}] * 2, step=6)
        turns.generate_single_turn([[1, 2, 3]] * 2, None, None, num_generations=2)
    else:
        # TRL's VLLMGeneration.generate on rank 0: its client's request, its session, no timeout
        generation.generate = lambda prompts: client.generate(prompts=prompts, n=2, max_tokens=8)
        bound_generation(trainer, schedule)
        generation.generate([[1, 2, 3]])
print("the samples came", flush=True)
"""


class WedgedEngine(http.server.BaseHTTPRequestHandler):
    """A vLLM server whose process answers /health (and /health/, and /v1/models, which TRL's client asks first) and
    whose engine never generates: a generation's request is read and never answered."""

    def do_GET(self) -> None:
        path = self.path.rstrip("/")
        if path == "/health":
            self.answer(200, b"")
        elif path == "/v1/models":
            self.answer(200, json.dumps({"data": [{"id": "tiny"}]}).encode())
        else:
            self.answer(404, b"")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.asked.append(time.monotonic())  # type: ignore[attr-defined]
        time.sleep(3600)

    def answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def wedged_engine() -> Iterator[Tuple[str, List[float]]]:
    """A :class:`WedgedEngine` server on a free local port: its base URL, and when each generation was asked of it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), WedgedEngine)
    server.daemon_threads, server.asked = True, []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.asked
    finally:
        server.shutdown()


def ended_alone(code: str, tmp_path: Path, *args: str, **env: str) -> Tuple[subprocess.CompletedProcess, float, str]:
    """``python -c code args`` with an error file, as torchrun starts a rank; how it ended, its seconds, what it left
    in the error file."""
    error_file_path = tmp_path / "error.json"
    started = time.monotonic()
    ended = subprocess.run(
        [sys.executable, "-c", code, *args],
        env={"TORCHELASTIC_ERROR_FILE": str(error_file_path), "HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"}
        | env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - started
    recorded = json.loads(error_file_path.read_text())["message"]["message"] if error_file_path.exists() else ""
    return ended, took, recorded


@pytest.mark.parametrize("max_lag", [0, 1], ids=["lockstep", "ahead"])
def test_a_generation_the_role_never_answers_while_its_health_does_ends_the_process_within_its_timeout(
    tmp_path: Path, max_lag: int
) -> None:
    with wedged_engine() as (base_url, asked):
        ended, _, recorded = ended_alone(ROLE, tmp_path, base_url, str(max_lag), POSTTRAIN_VLLM_HOST="127.0.0.1")
        waited = time.monotonic() - asked[0]
    line = (
        f"posttrain: vllm role: the server at {base_url} did not answer the generation of step 7 within 2 s "
        "(generation.generate_timeout_s); see its log"
    )
    assert ended.returncode == 2 and ended.stdout == "", (ended.returncode, ended.stdout, ended.stderr)
    assert ended.stderr.splitlines() == [line], ended.stderr
    assert recorded == line
    # from the request's arrival: the 2 s of the bound, then the process's end
    assert len(asked) == 1 and 2 <= waited < 2 + 3, (asked, waited)


# a colocated engine's generate that never returns (vLLM's LLM in the trainer's process: nothing outside can stop
# it, so the engine here is a call that blocks), on rank 1 of a job
COLOCATED = """
import threading
from types import SimpleNamespace

from posttrain.components.spec.generation import TrainingGeneration
from posttrain.entrypoints.generation.turns import bound_generation

generation = SimpleNamespace(mode="colocate", generate=lambda prompts: threading.Event().wait())
trainer = SimpleNamespace(
    vllm_generation=generation,
    accelerator=SimpleNamespace(is_main_process=False, process_index=1),
    args=SimpleNamespace(ddp_timeout=300),
    state=SimpleNamespace(global_step=2),
)
bound_generation(trainer, TrainingGeneration(generate_timeout_s=1.5))
generation.generate([[1, 2, 3]])
print("the samples came", flush=True)
"""


def test_a_colocated_generation_that_never_returns_ends_its_process_within_its_timeout(tmp_path: Path) -> None:
    ended, took, recorded = ended_alone(COLOCATED, tmp_path)
    line = (
        "posttrain: vllm engine (colocated, rank 1): the generation of step 3 did not end within 1.5 s "
        "(generation.generate_timeout_s)"
    )
    assert ended.returncode == 2 and ended.stdout == "", (ended.returncode, ended.stdout, ended.stderr)
    assert ended.stderr.splitlines() == [line], ended.stderr
    assert recorded == line
    assert took < 60, took


def test_an_unset_generation_timeout_ends_before_the_other_processes_wait_for_the_samples() -> None:
    assert TrainingGeneration().generate_timeout(300) == 270
    assert TrainingGeneration(generate_timeout_s=40).generate_timeout(300) == 40


# vLLM, for an evaluation's sampling process: it starts its engine's process, as vLLM starts its engine core, says
# so, and never answers
HUNG_VLLM = """
import os
import subprocess
import sys
import time

engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
said = os.environ["HUNG_ENGINE"]
with open(said + ".part", "w") as pids:
    pids.write(f"{os.getpid()} {engine.pid}")
os.replace(said + ".part", said)
time.sleep(3600)
"""

# an evaluation's rank sampling one model in vLLM (evaluation/run.py calls sample_with_vllm so)
SAMPLING = """
import os
import sys

from posttrain.components.spec.judging import GenerationSpec
from posttrain.components.spec.sections import ModelSpec
from posttrain.entrypoints.evaluation.sampling import sample_with_vllm
from posttrain.entrypoints.process.ending import ends_in_one_line

# the sampling process finds vLLM there
os.environ["PYTHONPATH"] = sys.argv[1]
with ends_in_one_line():
    model = ModelSpec(name_or_path="builtin:tiny-llama3-vllm")
    sample_with_vllm(model, [[1, 2, 3]], [0], GenerationSpec(engine="vllm", vllm_timeout_s=float(sys.argv[2])))
print("sampled", flush=True)
"""


def hung_vllm(tmp_path: Path) -> Tuple[Path, Path]:
    """A directory holding :data:`HUNG_VLLM` as the package ``vllm``, and the file where it says its pids."""
    package = tmp_path / "hung" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(HUNG_VLLM)
    return package.parent, tmp_path / "engine-pids"


def sampler_and_engine(said: Path, within: float) -> List[int]:
    """The pids of the sampling process and of its engine's, once the hung vLLM said them."""
    deadline = time.monotonic() + within
    while not said.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert said.exists(), "the sampling process did not reach vLLM"
    return [int(pid) for pid in said.read_text().split()]


def survivors_killed(pids: List[int], within: float) -> List[int]:
    """Those of ``pids`` still running ``within`` seconds from now, killed (a test that fails leaves none behind)."""
    processes = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            processes.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(processes, timeout=within)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    return [process.pid for process in alive]


def test_an_evaluations_vllm_sampling_that_never_ends_is_killed_with_its_engine_in_one_line(tmp_path: Path) -> None:
    hung, said = hung_vllm(tmp_path)
    bound_s = 10
    ended, took, recorded = ended_alone(SAMPLING, tmp_path, str(hung), str(bound_s), HUNG_ENGINE=str(said))
    line = (
        f"posttrain: generation.vllm_timeout_s: vLLM's sampling of builtin:tiny-llama3-vllm did not end within "
        f"{bound_s} s: its engine hung, or this process's prompts need longer (raise it)"
    )
    assert ended.returncode == 2 and ended.stdout == "", (ended.returncode, ended.stdout, ended.stderr)
    assert ended.stderr.splitlines() == [line], ended.stderr
    assert recorded == line
    # the engine had started (the sampler reaches vLLM in some 4 s) and went with the sampler
    assert survivors_killed(sampler_and_engine(said, within=0), within=5) == []
    assert bound_s <= took < bound_s + 30, took


def test_a_rank_stopped_while_vllm_samples_leaves_no_sampling_process_behind(tmp_path: Path) -> None:
    """torchrun starts each rank in a session of its own and stops it by signalling that session's process group:
    the sampling process and its engine are in it, and end with the rank."""
    hung, said = hung_vllm(tmp_path)
    rank = subprocess.Popen(
        [sys.executable, "-c", SAMPLING, str(hung), "3600"],
        env={"HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin", "HUNG_ENGINE": str(said)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        pids = sampler_and_engine(said, within=60)
        os.killpg(rank.pid, signal.SIGTERM)
        assert rank.wait(timeout=30) == -signal.SIGTERM
        assert survivors_killed(pids, within=5) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rank.pid, signal.SIGKILL)
