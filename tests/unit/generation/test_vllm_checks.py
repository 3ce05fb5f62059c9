"""vLLM's settings and the checks before vLLM starts: fast, without vLLM (the runs are in test_vllm.py, -m vllm)."""

import http.server
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import pytest
import torch
from transformers import LlamaForCausalLM

from helpers import load_template
from posttrain.components.spec.loading import SpecError, validate
from posttrain.components.spec.registry import SPEC_CLASSES
from posttrain.entrypoints.generation import vllm_generation
from posttrain.entrypoints.generation.vllm_generation import config_problems, head_size_problem, training_dtype
from posttrain.entrypoints.inputs import tiny
from posttrain.entrypoints.records import summary


def grpo_vllm(**training: object):
    raw = load_template("grpo/tiny-vllm.yaml")
    raw["training"].update(training)
    return validate(raw)


@pytest.mark.parametrize(
    "training, message",
    [
        (
            {"vllm_gpu_memory_utilization": 0},
            "training.vllm_gpu_memory_utilization: 0 is out of range; expected 0 < vllm_gpu_memory_utilization <= 1",
        ),
        ({"vllm_gpu_memory_utilization": 1.5}, "training.vllm_gpu_memory_utilization: 1.5 is out of range"),
        (
            {"vllm_tensor_parallel_size": 0},
            "training.vllm_tensor_parallel_size: 0 is out of range; expected vllm_tensor_parallel_size >= 1",
        ),
        (
            {"vllm_max_model_length": 0},
            "training.vllm_max_model_length: 0 is out of range; expected vllm_max_model_length >= 1",
        ),
        ({"vllm_model_impl": "vllmm"}, "training.vllm_model_impl: "),
        ({"vllm_mode": "colocated"}, "training.vllm_mode: "),
    ],
)
def test_vllm_settings_are_validated_with_the_key(training: dict, message: str) -> None:
    with pytest.raises(SpecError) as error:
        grpo_vllm(**training)
    assert message in str(error.value)


def test_the_vllm_template_and_every_value_vllm_takes_validate() -> None:
    spec = grpo_vllm(vllm_gpu_memory_utilization=1, vllm_max_model_length=None, vllm_model_impl="transformers")
    assert spec.training["use_vllm"] is True and spec.training["vllm_mode"] == "colocate"


def test_on_cpu_sleep_mode_and_online_dpos_server_mode_are_one_line_each_and_gpus_take_both() -> None:
    training = {"vllm_mode": "server", "vllm_enable_sleep_mode": True}
    assert config_problems(SPEC_CLASSES["grpo"], training, on_cpu=True) == [
        "training.vllm_enable_sleep_mode: vLLM's sleep mode needs GPUs; remove it on CPU",
    ]
    assert config_problems(SPEC_CLASSES["online_dpo"], training, on_cpu=True) == [
        "training.vllm_mode: online_dpo's server mode needs GPUs (TRL asks torch for an accelerator); on CPU use "
        "colocate",
        "training.vllm_enable_sleep_mode: vLLM's sleep mode needs GPUs; remove it on CPU",
    ]
    assert config_problems(SPEC_CLASSES["online_dpo"], training, on_cpu=False) == []
    assert config_problems(SPEC_CLASSES["grpo"], {"vllm_mode": "colocate"}, on_cpu=True) == []


def test_a_head_size_vllm_on_cpu_does_not_take_is_named_with_a_model_it_takes() -> None:
    small = SimpleNamespace(hidden_size=64, num_attention_heads=4, head_dim=None)
    assert head_size_problem(small, on_cpu=True) == (
        "model.name_or_path: head size 16; vLLM on CPU takes 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512"
        " (builtin:tiny-llama3-vllm is a tiny model it takes)"
    )
    assert head_size_problem(small, on_cpu=False) is None
    assert head_size_problem(SimpleNamespace(hidden_size=64, num_attention_heads=2, head_dim=None), on_cpu=True) is None
    assert head_size_problem(SimpleNamespace(hidden_size=4096, num_attention_heads=32, head_dim=128), True) is None


def test_vllm_runs_in_the_dtype_training_computes_in() -> None:
    spec = grpo_vllm()
    for on_cpu in (True, False):
        assert (
            training_dtype({"bf16": False}, spec.model, None, on_cpu) == "float32"
            # vLLM would make fp32 weights bf16
        )
        assert training_dtype({"bf16": True}, spec.model, torch.float32, on_cpu) == "bfloat16"
        assert training_dtype({"fp16": True}, spec.model, None, on_cpu) == "float16"
    # bf16 unset: TRL's default on GPUs is bf16 mixed precision, whatever the weights; off on CPU (posttrain's)
    assert training_dtype({}, spec.model, torch.float32, on_cpu=False) == "bfloat16"
    assert training_dtype({}, spec.model, torch.bfloat16, on_cpu=True) == "bfloat16"
    assert training_dtype({}, spec.model, torch.float32, on_cpu=True) == "float32"
    raw = load_template("grpo/tiny-vllm.yaml")
    raw["model"]["dtype"] = "float16"
    assert training_dtype({}, validate(raw).model, torch.float32, on_cpu=True) == "float16"


@pytest.mark.parametrize("on_cpu", [True, False])
def test_trls_colocated_engine_runs_eagerly_on_cpu_and_as_vllm_chooses_on_gpus(on_cpu: bool) -> None:
    """The keywords TRL's ``LLM(...)`` call reaches vLLM with (torch.compile adds 23 s to a CPU engine's start-up:
    BENCHMARKS.md); the engines' runs are in test_vllm.py."""
    spec, built = grpo_vllm(), {}
    make = vllm_generation._llm_factory(lambda **kwargs: built.update(kwargs), spec.model, {"bf16": False}, on_cpu)
    make(model="", max_model_len=256)
    assert built["enforce_eager"] is on_cpu and built["max_model_len"] == 256
    # the built-in model's directory
    assert (Path(built["model"]) / "config.json").is_file()


def test_the_vllm_builtin_is_tiny_llama3_with_heads_of_32_and_the_same_weights() -> None:
    tokenizer = tiny.BUILTINS[tiny.NAME_LLAMA3][0]()
    plain = tiny.BUILTINS[tiny.NAME_LLAMA3][1](tokenizer, LlamaForCausalLM)
    wide = tiny.BUILTINS[tiny.NAME_LLAMA3_VLLM][1](tokenizer, LlamaForCausalLM)
    assert (plain.config.head_dim, wide.config.head_dim) == (16, 32)
    assert wide.config.num_key_value_heads == 1 and wide.generation_config.top_k == 20
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), wide.parameters()))


def test_the_summary_says_how_completions_were_generated_without_vllm() -> None:
    trainer = SimpleNamespace(args=SimpleNamespace(use_vllm=False))
    assert summary.generation(trainer) == {
        "engine": "transformers",
        "mode": "generate",
        "weight_sync": None,
        "tokens_per_s": None,
    }


class Server(http.server.ThreadingHTTPServer):
    """A server on a free port of this host that answers every POST as ``answer`` says (a status, or None: never)."""

    def __init__(self, answer: Optional[int]) -> None:
        answered = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                if answer is None:
                    # a role that stopped answering: holds the request until the test ends
                    answered.wait(30)
                    return
                body = b"reload_checkpoint: no such file"
                self.send_response(answer)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.daemon_threads = True
        self.released = answered
        self.url = f"http://127.0.0.1:{self.server_port}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *args: object) -> None:
        self.released.set()
        self.shutdown()


def test_a_weight_reload_the_server_cannot_do_is_one_line(tmp_path: Path) -> None:
    # on CPU the trainers write the weights under output_dir and the server reloads them: a server that does not
    # see output_dir fails there
    with Server(500) as server:

        class Client:
            base_url, _updating_weights, session = server.url, False, SimpleNamespace(auth=None)

        vllm_generation._write_and_reload(Client, tmp_path, timeout_s=10)
        with pytest.raises(SpecError) as error:
            Client().update_named_params(None, iter([("w", torch.zeros(2))]))
    message = str(error.value)
    assert message.startswith(f"vllm role: the server at {server.url} could not reload the weights from {tmp_path}")
    assert "(HTTP 500: reload_checkpoint: no such file); it reads them from training.output_dir" in message
    # the file written for it is gone
    assert not list(tmp_path.iterdir())


def test_a_server_that_does_not_answer_a_reload_ends_it_in_one_line_within_its_timeout(tmp_path: Path) -> None:
    with Server(None) as server:
        folder = vllm_generation.write_weights({"w": torch.zeros(2)}, tmp_path)
        started = time.monotonic()
        with pytest.raises(SpecError) as error:
            vllm_generation.reload_weights(None, server.url, folder, timeout_s=1.5)
        waited = time.monotonic() - started
    assert str(error.value) == (
        f"vllm role: the server at {server.url} did not take the weights within 2 s "
        "(generation.weight_sync_timeout_s); see its log"
    )
    # asked once, not again as TRL's session would
    assert waited < 5
    assert not list(tmp_path.iterdir())
