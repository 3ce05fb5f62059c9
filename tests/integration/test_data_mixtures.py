"""An interleaved mixture of two sources, each with its own columns, trains: SFT's loss falls over 15 steps, in
process."""

from pathlib import Path

import pytest

from helpers import CHAT, REPO, _pc, _qa, load_template, read_json, run_entrypoint
from posttrain.components.spec.loading import validate


def test_sft_learns_from_an_interleaved_mixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    qa = _qa(tmp_path)
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("RANK", "0")
    raw = load_template("sft/tiny.yaml")
    raw["data"] = {
        "train": [
            {"path": str(CHAT), "weight": 1},
            {"path": qa, "weight": 1, "columns": {"question": "prompt", "answer": "completion"}},
        ],
        "mix": "interleave",
    }
    raw["training"].update(output_dir=str(tmp_path / "out"), max_steps=15, save_steps=100)
    raw["data"]["train"][0] = {"path": _pc(tmp_path), "weight": 1}
    run_entrypoint("sft", validate(raw).to_json())
    summary = read_json(tmp_path / "out" / "run_summary.json")
    assert summary["metrics_last"]["loss"] < 0.8 * summary["metrics_first"]["loss"], summary["metrics_last"]
