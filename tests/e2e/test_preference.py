"""DPO, reward model, KTO and ORPO end to end through ``torchx run -s local_cwd -j 1x2``: each learns."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from helpers import REPO, assert_succeeded, ends, read_json, run_template

pytestmark = pytest.mark.e2e


def test_dpo_prefers_chosen(tmp_path: Path) -> None:
    output_dir = tmp_path / "dpo"
    assert_succeeded(run_template("dpo/tiny.yaml", tmp_path, output_dir))
    _, accuracy = ends(output_dir, "rewards/accuracies")
    margin_first, margin_last = ends(output_dir, "rewards/margins")
    assert accuracy >= 0.75
    assert margin_last > 0 and margin_last > margin_first
    assert read_json(output_dir / "run_summary.json")["engine"]["strategy"] == "ddp"
    # what the run wrote for people: the metrics as logged, and a figure of exactly those
    from helpers import assert_metrics_match_the_trainer, assert_valid_png
    from posttrain.entrypoints.records import curves

    records = assert_metrics_match_the_trainer(output_dir)
    data = assert_valid_png(output_dir / curves.CURVES_FILE)
    assert data["runs"] == {output_dir.name: curves.series(records)}
    assert {"loss", "rewards/margins", "rewards/accuracies"} <= set(data["runs"][output_dir.name])


def test_dpo_with_lora_learns_and_saves_the_adapter(tmp_path: Path) -> None:
    output_dir = tmp_path / "dpo-lora"
    lora = "model.lora={r: 16, lora_alpha: 32, target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}"
    assert_succeeded(
        run_template("dpo/tiny.yaml", tmp_path, output_dir, overrides=[lora, "training.learning_rate=5e-3"])
    )
    margin_first, margin_last = ends(output_dir, "rewards/margins")
    assert margin_last > 0 and margin_last > margin_first
    assert json.loads((output_dir / "adapter_config.json").read_text())["r"] == 16


def held_out_wins(reward_dir: Path) -> float:
    """The share of held-out pairs the saved reward model ranks right, scoring as an RLHF job would."""
    model = AutoModelForSequenceClassification.from_pretrained(reward_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(reward_dir)

    def score(prompt: list, answer: list) -> float:
        # the chat template writes any BOS itself: the tokenizer must not add a second one
        text = tokenizer.apply_chat_template(prompt + answer, tokenize=False)
        with torch.no_grad():
            return model(**tokenizer(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item()

    rows = [json.loads(line) for line in (REPO / "templates/data/preference_heldout.jsonl").read_text().splitlines()]
    return sum(score(r["prompt"], r["chosen"]) > score(r["prompt"], r["rejected"]) for r in rows) / len(rows)


def test_reward_model_ranks_held_out_pairs(reward_model: Path) -> None:
    _, accuracy = ends(reward_model, "accuracy")
    assert accuracy >= 0.8
    assert held_out_wins(reward_model) >= 0.7


def test_reward_model_of_a_real_shaped_model_without_a_pad_token(tmp_path: Path) -> None:
    """Llama-3-like: no pad token (EOS pads, as the job sets it), a BOS, dropout; the score is still read right."""
    output_dir = tmp_path / "reward"
    assert_succeeded(
        run_template("reward/tiny.yaml", tmp_path, output_dir, overrides=["model.name_or_path=builtin:tiny-llama3"])
    )
    _, accuracy = ends(output_dir, "accuracy")
    assert accuracy >= 0.8
    assert held_out_wins(output_dir) >= 0.7


@pytest.mark.parametrize("algorithm", ["kto", "orpo"])
def test_loss_falls(tmp_path: Path, algorithm: str) -> None:
    output_dir = tmp_path / algorithm
    assert_succeeded(run_template(f"{algorithm}/tiny.yaml", tmp_path, output_dir))
    first, last = ends(output_dir, "loss")
    assert last <= 0.9 * first, f"loss {first:.3f} -> {last:.3f}"
