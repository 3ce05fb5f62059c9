"""GRPO, GSPO, RLOO, online DPO and PPO end to end through ``torchx run -s local_cwd``: the reward rises."""

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from helpers import assert_succeeded, ends, load_template, read_json, run_template, series
from posttrain.entrypoints.records.curves import METRICS_FILE, read_metrics

pytestmark = pytest.mark.e2e


def reward_rise(output_dir: Path, key: str) -> float:
    first, last = ends(output_dir, key)
    return last - first


@pytest.fixture(scope="module")
def ppo_run(session_tmp: Path) -> Path:
    output_dir = session_tmp / "ppo"
    assert_succeeded(run_template("ppo/tiny.yaml", session_tmp, output_dir))
    return output_dir


# GRPO's on two nodes of one process each (a multi-node rendezvous), the others on one node of two processes
@pytest.mark.parametrize(
    "template, j", [("grpo/tiny.yaml", "2x1"), ("grpo/gspo-tiny.yaml", "1x2"), ("rloo/tiny.yaml", "1x2")]
)
def test_group_methods_raise_the_reward(tmp_path: Path, template: str, j: str) -> None:
    output_dir = tmp_path / "out"
    result = run_template(template, tmp_path, output_dir, j=j)
    assert_succeeded(result)
    assert reward_rise(output_dir, "reward") >= 0.2
    summary = read_json(output_dir / "run_summary.json")
    assert (summary["world_size"], summary["nnodes"]) == (2, int(j[0]))
    # tiny-llama3 has attention dropout, which TRL's generation in training mode draws: generate decodes its
    # rollouts, and the job says why; tiny-llama's, the rollout generator (entrypoints/speed/rollout_generator.py)
    line = "rollouts: transformers' generate, not the rollout generator, which does not decode a model with dropout"
    dropout = load_template(template)["model"]["name_or_path"] == "builtin:tiny-llama3"
    assert (result.stdout + result.stderr).count(line) == dropout
    assert ("rollout_generator" in summary["fast_paths"]) != dropout
    # a few of each logged step's rollouts, whole, with their scores
    samples = [json.loads(line) for line in (output_dir / "samples.jsonl").read_text().splitlines()]
    assert {sample["step"] for sample in samples} == {
        entry["step"] for entry in read_metrics(output_dir / METRICS_FILE)
    }
    assert all(sample["prompt"] and "contains" in sample["rewards"] for sample in samples)


@pytest.mark.parametrize("template", ["grpo/tiny.yaml", "rloo/tiny.yaml"])
def test_padding_free_passes_raise_the_reward(tmp_path: Path, template: str) -> None:
    """The passes a GPU packs by default (torch_varlen; on CPU SDPA one sequence at a time), in two processes."""
    output_dir = tmp_path / "out"
    overrides = ["model.name_or_path=builtin:tiny-llama", "model.attn_implementation=torch_varlen"]
    assert_succeeded(run_template(template, tmp_path, output_dir, overrides=overrides))
    assert reward_rise(output_dir, "reward") >= 0.2
    # tiny-llama has no dropout: the rollout generator decodes its rollouts (entrypoints/speed/rollout_generator.py)
    assert {"padding_free", "rollout_generator"} <= set(read_json(output_dir / "run_summary.json")["fast_paths"])


def test_online_dpo_raises_the_score_of_its_sampled_answers(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    assert_succeeded(run_template("online_dpo/tiny.yaml", tmp_path, output_dir))
    assert reward_rise(output_dir, "objective/scores") >= 0.2
    assert read_json(output_dir / "run_summary.json")["algorithm"] == "online_dpo"
    assert AutoModelForCausalLM.from_pretrained(output_dir) is not None


def test_ppo_raises_the_reward_and_saves_policy_and_value_model(ppo_run: Path) -> None:
    assert reward_rise(ppo_run, "objective/scores") >= 0.2
    entry = series(ppo_run, "objective/kl")
    assert entry[0] == pytest.approx(0.0, abs=1e-4), "logprobs must use the sampling temperature"
    # a linear schedule over 30 iterations, on 2 processes: half the initial rate after 15, not 0
    learning_rates = series(ppo_run, "learning_rate")
    initial = read_json(ppo_run / "run_summary.json")["spec"]["training"]["learning_rate"]
    assert learning_rates[14] == pytest.approx(initial / 2) and learning_rates[-1] == pytest.approx(0.0, abs=1e-12)
    for key in ("loss/policy", "loss/value", "policy/clipfrac", "objective/entropy"):
        assert len(series(ppo_run, key)) == 30, key
    summary = read_json(ppo_run / "run_summary.json")
    assert summary["algorithm"] == "ppo" and summary["global_steps"] == 30
    assert summary["engine"] == {"backend": "gloo", "strategy": "ddp", "zero_stage": None}
    assert summary["train_tokens"] > 0
    AutoModelForCausalLM.from_pretrained(ppo_run)
    AutoModelForSequenceClassification.from_pretrained(ppo_run / "value_model")


def test_ppo_resumes_from_its_checkpoint(ppo_run: Path, session_tmp: Path) -> None:
    output_dir = session_tmp / "ppo-resumed"
    output_dir.mkdir()
    shutil.copytree(ppo_run / "checkpoint-20", output_dir / "checkpoint-20")
    shutil.copy(ppo_run / "posttrain_spec.json", output_dir)
    assert_succeeded(run_template("ppo/tiny.yaml", session_tmp, output_dir))
    summary = read_json(output_dir / "run_summary.json")
    assert summary["resumed_from"] == str(output_dir / "checkpoint-20") and summary["global_steps"] == 30
    assert [e["step"] for e in read_json(output_dir / "trainer_state.json")["log_history"] if "loss" in e] == list(
        range(1, 31)
    )
    # the same prompts and sampling streams: the resumed steps repeat the original run's rollouts
    assert series(output_dir, "objective/scores")[20] == pytest.approx(series(ppo_run, "objective/scores")[20])


def test_user_reward_function_from_the_workspace(tmp_path: Path) -> None:
    module_dir = tmp_path / "user_code"
    module_dir.mkdir()
    (module_dir / "my_rewards.py").write_text(
        textwrap.dedent("""
        def says_blue(completions, **columns):
            return [float("blue" in c[0]["content"].lower()) for c in completions]
    """)
    )
    output_dir = tmp_path / "out"
    result = run_template(
        "grpo/tiny.yaml",
        tmp_path,
        output_dir,
        overrides=["rewards=[{function: 'my_rewards:says_blue'}]"],
        PYTHONPATH=str(module_dir),
    )
    assert_succeeded(result)
    assert reward_rise(output_dir, "reward") >= 0.2
    assert series(output_dir, "rewards/says_blue/mean")


def test_unimportable_user_code_stops_the_job_before_the_model_loads(tmp_path: Path) -> None:
    result = run_template(
        "grpo/tiny.yaml", tmp_path, tmp_path / "out", overrides=["rewards=[{function: 'nowhere:score'}]"]
    )
    assert result.returncode != 0
    logs = result.stdout + result.stderr
    assert "rewards.0.function: cannot import nowhere:score" in logs and "No module named 'nowhere'" in logs
    assert "training grpo on" not in logs


@pytest.mark.gpu
def test_ppo_on_gpus_in_bf16_with_a_linear_schedule_and_a_real_shaped_model(tmp_path: Path) -> None:
    """PPO on up to two GPUs: fp32 weights under bf16 autocast, a 12-layer Llama built offline, rates on schedule."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from posttrain.entrypoints.inputs import tiny

    gpus = min(torch.cuda.device_count(), 2)
    assert gpus >= 1, "run with pytest -m gpu on a machine with GPUs"
    tokenizer = tiny.build_tokenizer_llama3()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=12,
        num_attention_heads=16,
        num_key_value_heads=8,
        attention_dropout=0.1,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    model_dir = tmp_path / "model"
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    output_dir = tmp_path / "out"
    overrides = [
        f"model.name_or_path={model_dir}",
        "model.dtype=float32",
        "training.bf16=true",
        "training.max_steps=10",
        "training.lr_scheduler_type=linear",
        "training.learning_rate=1.0e-5",
    ]
    result = run_template(
        "ppo/tiny.yaml", tmp_path, output_dir, j=f"1x{gpus}", overrides=overrides, extra_args=["--gpu", str(gpus)]
    )
    assert_succeeded(result)
    summary = read_json(output_dir / "run_summary.json")
    assert summary["world_size"] == gpus and "nccl" in summary["engine"]["backend"]
    assert series(output_dir, "objective/kl")[0] == pytest.approx(0.0, abs=1e-3), "reference in the same autocast"
    assert series(output_dir, "learning_rate")[4] == pytest.approx(0.5e-5)
    assert AutoModelForCausalLM.from_pretrained(output_dir).dtype == torch.float32
