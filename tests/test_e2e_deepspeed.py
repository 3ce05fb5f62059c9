"""DeepSpeed ZeRO on CPU through ``torchx run -s local_cwd -j 1x2``: what ran is what the spec asked for."""

import json
from pathlib import Path

import pytest
from helpers import assert_succeeded, ends, read_json, run_template, series
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def plain_losses(sft_1x2: Path) -> list:
    return series(sft_1x2, "loss")


OFFLOAD = ["distributed.deepspeed.offload_optimizer=true", "distributed.deepspeed.offload_params=true"]


@pytest.mark.parametrize(
    "template, stage, overrides",
    [("sft/tiny-zero2.yaml", 2, []), ("sft/tiny-zero3.yaml", 3, []), ("sft/tiny-zero3.yaml", 3, OFFLOAD)],
    ids=["zero2", "zero3", "zero3-offload"],
)
def test_sft_with_zero_learns_like_ddp_and_reports_deepspeed(
    tmp_path: Path, plain_losses: list, template: str, stage: int, overrides: list
) -> None:
    output_dir = tmp_path / "out"
    assert_succeeded(run_template(template, tmp_path, output_dir, overrides=overrides))
    summary = read_json(output_dir / "run_summary.json")
    assert summary["engine"] == {"backend": "gloo", "strategy": "deepspeed", "zero_stage": stage}
    first, last = ends(output_dir, "loss")
    assert last <= 0.7 * first
    # same seed, data and settings: the first steps match plain DDP
    assert series(output_dir, "loss")[:3] == pytest.approx(plain_losses[:3], rel=0.05)
    checkpoint = output_dir / "checkpoint-20"
    assert any(p.name.startswith("global_step") for p in checkpoint.iterdir()), "DeepSpeed's checkpoint layout"
    AutoModelForCausalLM.from_pretrained(output_dir)
    assert json.loads((output_dir / "config.json").read_text())["num_hidden_layers"] == 2


ZERO3 = "distributed.deepspeed={zero_stage: 3}"


def test_dpo_with_zero3_from_a_model_path_learns(tmp_path: Path, sft_1x2: Path) -> None:
    output_dir = tmp_path / "dpo"
    overrides = [f"model.name_or_path={sft_1x2}", ZERO3]
    assert_succeeded(run_template("dpo/tiny.yaml", tmp_path, output_dir, overrides=overrides))
    assert read_json(output_dir / "run_summary.json")["engine"]["zero_stage"] == 3
    margin_first, margin_last = ends(output_dir, "rewards/margins")
    _, accuracy = ends(output_dir, "rewards/accuracies")
    assert accuracy >= 0.75 and margin_last > max(margin_first, 0)


def test_grpo_with_zero3_from_a_model_path_raises_the_reward(tmp_path: Path, sft_1x2: Path) -> None:
    output_dir = tmp_path / "grpo"
    overrides = [f"model.name_or_path={sft_1x2}", ZERO3]
    assert_succeeded(run_template("grpo/tiny.yaml", tmp_path, output_dir, overrides=overrides))
    assert read_json(output_dir / "run_summary.json")["engine"]["zero_stage"] == 3
    first, last = ends(output_dir, "reward")
    assert last - first >= 0.2
