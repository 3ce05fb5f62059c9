"""metrics.jsonl and curves.png as real runs write them (the callback, the figure, the plot command: unit tests)."""

from pathlib import Path

import pytest

from helpers import (
    assert_metrics_match_the_trainer,
    assert_succeeded,
    assert_valid_png,
    lines,
    read_json,
    run_template,
)
from posttrain.entrypoints.records import curves

# ---------------------------------------------------------------- real runs


@pytest.mark.e2e
def test_a_run_writes_its_metrics_and_curves(sft_1x2: Path) -> None:
    records = assert_metrics_match_the_trainer(sft_1x2)
    assert all({"loss", "learning_rate", "epoch", "step"} <= set(record) for record in records)
    data = assert_valid_png(sft_1x2 / curves.CURVES_FILE)
    assert data["title"] == "sft · builtin:tiny-llama · 2 processes"
    assert data["runs"] == {sft_1x2.name: curves.series(records)}
    assert list(data["runs"][sft_1x2.name]) == ["loss", "learning_rate"]


@pytest.mark.e2e
def test_a_crashed_run_leaves_its_history_and_the_next_run_continues_it(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    crashed = run_template("sft/tiny.yaml", tmp_path, output_dir, POSTTRAIN_FAULT="exit:1:25")
    assert crashed.returncode != 0
    steps = [record["step"] for record in lines(output_dir / curves.METRICS_FILE)]
    # rank 0 may log step 25 before the job ends
    assert steps in (list(range(1, 25)), list(range(1, 26))), steps
    assert not (output_dir / curves.CURVES_FILE).exists()
    # checkpoint-20 was sealed once both ranks had written: its manifest names each rank's RNG state
    manifest = read_json(output_dir / "checkpoint-20" / "posttrain_manifest.json")["files"]
    assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "posttrain_inputs.json"} <= set(manifest)
    # the next run resumes from checkpoint-20: the crashed attempt's later steps are dropped, none doubled
    assert_succeeded(run_template("sft/tiny.yaml", tmp_path, output_dir))
    assert read_json(output_dir / "run_summary.json")["resumed_from"] == str(output_dir / "checkpoint-20")
    assert_metrics_match_the_trainer(output_dir)
    assert_valid_png(output_dir / curves.CURVES_FILE)
