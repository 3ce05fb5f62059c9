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


@pytest.mark.parametrize("template, stage", [("sft/tiny-zero2.yaml", 2), ("sft/tiny-zero3.yaml", 3)])
def test_sft_with_zero_learns_like_ddp_and_reports_deepspeed(
    tmp_path: Path, plain_losses: list, template: str, stage: int
) -> None:
    output_dir = tmp_path / "out"
    assert_succeeded(run_template(template, tmp_path, output_dir))
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
