"""SFT, and distillation from the SFT model, end to end through the real ``torchx run -s local_cwd``: they learn, and say so."""

import configparser
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, List

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from helpers import REPO, assert_succeeded, ends, job_env, read_json, run_template
from posttrain.entrypoints.inputs import tiny

pytestmark = pytest.mark.e2e

SUMMARY_KEYS = {
    "algorithm",
    "run_id",
    "inputs",
    "world_size",
    "nnodes",
    "engine",
    "weights",
    "global_steps",
    "train_runtime_s",
    "train_tokens",
    "tokens_per_s",
    "metrics_first",
    "metrics_last",
    "resumed_from",
    "spec",
    "fast_paths",
    "generation",
}


@pytest.fixture(scope="module")
def sft_2x1(session_tmp: Path) -> Path:
    output_dir = session_tmp / "sft-2x1"
    assert_succeeded(run_template("sft/tiny.yaml", session_tmp, output_dir, j="2x1"))
    return output_dir


def assert_learned(output_dir: Path, world_size: int, nnodes: int) -> None:
    first, last = ends(output_dir, "loss")
    assert last <= 0.7 * first, f"loss {first:.3f} -> {last:.3f}"
    summary = read_json(output_dir / "run_summary.json")
    assert set(summary) == SUMMARY_KEYS
    assert summary["algorithm"] == "sft" and summary["global_steps"] == 40
    assert (summary["world_size"], summary["nnodes"]) == (world_size, nnodes)
    assert summary["engine"] == {"backend": "gloo", "strategy": "ddp", "zero_stage": None}
    assert summary["weights"]["quantization"] is None
    # padding-free: on by default for SFT (entrypoints/speed/fast_paths.py); no checkpointing: the template's choice
    assert summary["fast_paths"] == ["padding_free", "no_activation_checkpointing"]
    assert summary["train_tokens"] > 0 and summary["tokens_per_s"] > 0 and summary["train_runtime_s"] > 0
    assert summary["resumed_from"] is None
    assert summary["spec"]["training"]["output_dir"] == str(output_dir)


def test_sft_1x2_learns(sft_1x2: Path) -> None:
    assert_learned(sft_1x2, world_size=2, nnodes=1)


def test_a_run_ends_with_one_line_of_what_it_did_and_where_the_model_is_without_library_noise(
    sft_1x2: Path, session_tmp: Path
) -> None:
    console = (session_tmp / "sft-1x2.console").read_text()
    said = [line.split("]:", 1)[1] for line in console.splitlines() if re.match(r"sft/0 \[\d\]:.*\S", line)]
    assert re.fullmatch(
        rf"posttrain: sft finished 40 steps in \d+ s, loss [\d.]+ -> [\d.]+; model in {sft_1x2}", said[-1]
    )
    for noise in (
        "Setting accelerator to CPU",
        "Writing model shards",
        "Loading weights",
        "OMP_NUM_THREADS",
        "find_unused_parameters",
    ):
        assert noise not in console
    others = [line for line in console.splitlines() if line.strip() and not re.search(r"INFO step \d+/40: ", line)]
    # torchx's own, the start line, the closing line
    assert len(others) <= 8, "\n".join(others)
    # the start line names where each process's output is kept; torchx deleted its own copy when the client exited
    assert f"training sft on 2 process(es); resume from scratch; logs kept in {sft_1x2 / 'logs'}" in console
    [rank0] = (sft_1x2 / "logs").glob("*/attempt_0/0/stderr.log")
    assert said[-1] in rank0.read_text() and "INFO step 40/40: loss" in rank0.read_text()


def test_sft_2x1_multinode_rendezvous_learns(sft_2x1: Path) -> None:
    assert_learned(sft_2x1, world_size=2, nnodes=2)


def test_sft_2x2_four_ranks_over_two_replicas_learns(tmp_path: Path) -> None:
    output_dir = tmp_path / "sft-2x2"
    assert_succeeded(run_template("sft/tiny.yaml", tmp_path, output_dir, j="2x2"))
    assert_learned(output_dir, world_size=4, nnodes=2)


@pytest.fixture(scope="module")
def bitsandbytes_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bitsandbytes as the gpu extra names it, installed aside for the jobs that quantize: the test extra leaves it
    out, as it adds a second to every job's start (PEFT imports it, and it compiles its kernels on import)."""
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    requirement = next(line for line in setup["options.extras_require"]["gpu"].split() if "bitsandbytes" in line)
    target = tmp_path_factory.mktemp("bitsandbytes")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), requirement]
    subprocess.run(pip, check=True)
    return target


def test_qlora_trains_an_adapter_on_weights_loaded_in_4_bits(tmp_path: Path, bitsandbytes_path: Path) -> None:
    """``model.quantization: 4bit`` with ``model.lora`` (bitsandbytes runs on CPUs too): the frozen weights take
    about half the tiny model's bytes (its embedding stays whole), and the adapter learns and is what is saved."""
    output_dir = tmp_path / "qlora"
    lora = "model.lora={r: 16, lora_alpha: 32, target_modules: all-linear}"
    overrides = ["model.quantization=4bit", lora, "training.learning_rate=5e-3"]
    run = run_template("sft/tiny.yaml", tmp_path, output_dir, overrides=overrides, PYTHONPATH=str(bitsandbytes_path))
    assert_succeeded(run)
    first, last = ends(output_dir, "loss")
    assert last <= 0.9 * first, (first, last)
    weights = read_json(output_dir / "run_summary.json")["weights"]
    tokenizer = tiny.BUILTINS["builtin:tiny-llama"][0]()
    whole = tiny.BUILTINS["builtin:tiny-llama"][1](tokenizer, LlamaForCausalLM).get_memory_footprint()
    assert weights["quantization"] == "4bit" and weights["bytes"] < 0.6 * whole, (weights, whole)
    adapter = load_file(output_dir / "adapter_model.safetensors")
    assert weights["trainable_parameters"] == sum(tensor.numel() for tensor in adapter.values())
    assert not (output_dir / "model.safetensors").exists()


def test_saved_model_reloads_and_generates(sft_1x2: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(sft_1x2)
    tokenizer = AutoTokenizer.from_pretrained(sft_1x2)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of Italy?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        output = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(output[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    # the learned answer form: "The capital of Italy is Rome."
    assert "capital" in answer, answer
    assert (sft_1x2 / "checkpoint-20" / "trainer_state.json").is_file()
    assert "This model is a fine-tuned version of `builtin:tiny-llama`." in (sft_1x2 / "README.md").read_text()


def test_a_finished_run_is_left_as_it_is_and_a_changed_spec_is_refused(sft_1x2: Path, session_tmp: Path) -> None:
    before = (sft_1x2 / "run_summary.json").read_text()
    again = run_template("sft/tiny.yaml", session_tmp, sft_1x2, j="1x2")
    assert_succeeded(again)
    assert "already holds this run, finished at" in again.stdout + again.stderr
    assert (sft_1x2 / "run_summary.json").read_text() == before

    changed = run_template("sft/tiny.yaml", session_tmp, sft_1x2, j="1x2", overrides=["training.learning_rate=0.01"])
    assert changed.returncode != 0
    assert "written by a different spec (training.learning_rate: 0.003 -> 0.01)" in changed.stderr


def test_library_use_as_in_the_design(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchx.runner import get_runner
    from torchx.specs import AppState

    from posttrain.components import sft

    for key, value in job_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(REPO)
    output_dir = tmp_path / "library"
    app = sft("training.max_steps=20", f"training.output_dir={output_dir}", spec="templates/sft/tiny.yaml", j="1x2")
    with get_runner() as runner:
        handle = runner.run(app, scheduler="local_cwd")
        status = runner.wait(handle, wait_interval=1)
    assert status is not None and status.state == AppState.SUCCEEDED, status
    assert read_json(output_dir / "run_summary.json")["global_steps"] == 20


def mean_kl_to_teacher(student: Any, teacher: Any, tokenizer: Any, prompts: List[Any], new_tokens: int = 16) -> float:
    """KL(teacher || student) per completion token, on the teacher's greedy completions of fixed prompts."""
    tokenizer.padding_side = "left"
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    start = batch.input_ids.shape[1]
    with torch.no_grad():
        sequences = teacher.generate(
            **batch, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
        completion = sequences[:, start:] != tokenizer.pad_token_id
        attention = torch.cat([batch.attention_mask, completion.long()], dim=1)
        teacher_logps = torch.log_softmax(teacher(sequences, attention_mask=attention).logits[:, start - 1 : -1], -1)
        student_logps = torch.log_softmax(student(sequences, attention_mask=attention).logits[:, start - 1 : -1], -1)
        kl = (teacher_logps.exp() * (teacher_logps - student_logps)).sum(-1)
    return float((kl * completion).sum() / completion.sum())


def test_distill_the_sft_model_into_a_fresh_one(sft_1x2: Path, tmp_path: Path) -> None:
    output_dir = tmp_path / "distill"
    result = run_template("distill/tiny.yaml", tmp_path, output_dir, overrides=[f"teacher_model={sft_1x2}"])
    assert_succeeded(result)
    first, last = ends(output_dir, "loss")
    assert last <= 0.8 * first, f"loss {first:.3f} -> {last:.3f}"
    # the loss is measured on the student's own samples, which change as it learns: measure it off-policy too,
    # on the teacher's completions of fixed prompts, the fresh student (the built-in model) against the trained one
    prompts = [json.loads(line)["prompt"] for line in (REPO / "templates/data/prompts.jsonl").read_text().splitlines()]
    teacher, tokenizer = AutoModelForCausalLM.from_pretrained(sft_1x2).eval(), AutoTokenizer.from_pretrained(sft_1x2)
    fresh = tiny.build_model(tiny.build_tokenizer(), LlamaForCausalLM).eval()
    before = mean_kl_to_teacher(fresh, teacher, tokenizer, prompts[:16])
    after = mean_kl_to_teacher(
        AutoModelForCausalLM.from_pretrained(output_dir).eval(), teacher, tokenizer, prompts[:16]
    )
    assert after <= 0.6 * before, f"KL to the teacher on its own completions: {before:.3f} -> {after:.3f}"
    summary = read_json(output_dir / "run_summary.json")
    assert summary["algorithm"] == "distill" and summary["world_size"] == 2
    assert (
        AutoModelForCausalLM.from_pretrained(output_dir).config.vocab_size
        == AutoModelForCausalLM.from_pretrained(sft_1x2).config.vocab_size
    )


def test_data_is_prepared_once_per_node_and_a_restart_reuses_it(tmp_path: Path) -> None:
    # TRL tokenizes on each node's first process first (trl.trainer.utils.global_then_local_main_first); the data
    # set is file-backed, so the others, and any later run with the same HF_HOME, load datasets' cache instead
    def cache_lines(attempt: int) -> Counter:
        output_dir = tmp_path / f"run-{attempt}"
        result = run_template(
            "sft/tiny.yaml",
            tmp_path,
            output_dir,
            j="1x2",
            overrides=["training.max_steps=2"],
            DATASETS_VERBOSITY="info",
        )
        assert_succeeded(result)
        found = re.findall(r"\[(\d)\]:(Caching|Loading cached) processed dataset", result.stdout + result.stderr)
        return Counter(found)

    first = cache_lines(1)
    assert first[("0", "Caching")] > 0 and first[("1", "Caching")] == 0
    assert first[("1", "Loading cached")] == first[("0", "Caching")]
    again = cache_lines(2)
    prepared = first[("0", "Caching")]
    assert again == Counter({("0", "Loading cached"): prepared, ("1", "Loading cached"): prepared})
