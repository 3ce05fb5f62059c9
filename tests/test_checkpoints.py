"""Resume: which checkpoint a job continues from, and when a run is already finished."""

import json
from pathlib import Path

import pytest
from helpers import sft_spec

from posttrain.components.spec import SpecError
from posttrain.entrypoints.checkpoints import (
    SPEC_FILE,
    already_finished,
    complete_checkpoints,
    resolve_resume,
)
from posttrain.entrypoints.summary import SUMMARY_FILE


def write_checkpoint(output_dir: Path, step: int, complete: bool = True, max_steps: int = 0) -> Path:
    path = output_dir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    state = json.dumps({"global_step": step, "max_steps": max_steps})
    (path / "trainer_state.json").write_text(state if complete else '{"global_')
    return path


def test_only_complete_checkpoints_count(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 10)
    write_checkpoint(tmp_path, 30, complete=False)
    write_checkpoint(tmp_path, 20)
    (tmp_path / "checkpoint-40").mkdir()
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["checkpoint-10", "checkpoint-20"]


def test_resume_auto_picks_the_newest_checkpoint_of_the_same_spec(tmp_path: Path) -> None:
    spec = sft_spec(tmp_path)
    output_dir = Path(spec.training["output_dir"])
    assert resolve_resume(spec, output_dir) is None
    write_checkpoint(output_dir, 5)
    newest = write_checkpoint(output_dir, 10)
    (output_dir / SPEC_FILE).write_text(json.dumps(spec.model_dump(mode="json")))
    assert resolve_resume(spec, output_dir) == str(newest)
    assert resolve_resume(sft_spec(tmp_path, resume=str(output_dir / "checkpoint-5")), output_dir).endswith("-5")


def test_resume_auto_refuses_a_checkpoint_of_another_spec(tmp_path: Path) -> None:
    spec = sft_spec(tmp_path)
    output_dir = Path(spec.training["output_dir"])
    write_checkpoint(output_dir, 10)
    saved = spec.model_dump(mode="json")
    saved["training"]["learning_rate"] = 0.5
    (output_dir / SPEC_FILE).write_text(json.dumps(saved))
    with pytest.raises(SpecError) as error:
        resolve_resume(spec, output_dir)
    assert "written by a different spec (training.learning_rate: 0.5 -> 0.003)" in str(error.value)


def test_resume_never_refuses_to_mix_runs_and_a_bad_path_is_named(tmp_path: Path) -> None:
    spec = sft_spec(tmp_path, resume="never")
    output_dir = Path(spec.training["output_dir"])
    assert resolve_resume(spec, output_dir) is None
    write_checkpoint(output_dir, 10)
    with pytest.raises(SpecError, match="resume: never, but .* already holds checkpoints"):
        resolve_resume(spec, output_dir)
    with pytest.raises(SpecError, match="resume: '.*nowhere' is neither auto, never nor an existing checkpoint directory"):
        resolve_resume(sft_spec(tmp_path, resume=str(tmp_path / "nowhere")), output_dir)
    (tmp_path / "half").mkdir()
    with pytest.raises(SpecError, match="is not a complete checkpoint"):
        resolve_resume(sft_spec(tmp_path, resume=str(tmp_path / "half")), output_dir)


def test_a_run_is_finished_at_its_last_step_of_max_steps_or_of_its_epochs(tmp_path: Path) -> None:
    # a finished run is left alone: resuming at the last step would take one step too many
    last = write_checkpoint(tmp_path, 40, max_steps=40)
    assert not already_finished(tmp_path, last, max_steps=40)  # no run_summary.json: the final save never happened
    (tmp_path / SUMMARY_FILE).write_text(json.dumps({"global_steps": 40}))
    assert already_finished(tmp_path, last, max_steps=40)
    assert not already_finished(tmp_path, last, max_steps=60)  # the spec asks for more steps
    assert already_finished(tmp_path, last, max_steps=-1)  # epochs: the step count the trainer recorded
    earlier = write_checkpoint(tmp_path, 20, max_steps=40)
    assert not already_finished(tmp_path, earlier, max_steps=-1)
