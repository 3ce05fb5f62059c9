"""Resume: which checkpoint a job continues from, checked before it is trusted, and when a run is already finished."""

import json
import shutil
from pathlib import Path
from typing import Any, Dict, List

import pytest

from helpers import REPO, load_template, resume_of, sft_spec
from posttrain.components.spec.loading import SpecError, validate
from posttrain.components.spec.overrides import apply_overrides
from posttrain.entrypoints.records import files
from posttrain.entrypoints.records.checkpoints import (
    MANIFEST_FILE,
    SPEC_FILE,
    complete_checkpoints,
    finished_at,
    job_inputs,
    resolve_resume,
    rotate_checkpoints,
    seal_checkpoint,
)
from posttrain.entrypoints.records.disk import disk_errors
from posttrain.entrypoints.records.files import file_problem
from posttrain.entrypoints.records.final_model import already_finished
from posttrain.entrypoints.records.summary import SUMMARY_FILE

INPUTS = {
    "data": {},
    "global_batch": {"processes": 1, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1},
}


def write_checkpoint(output_dir: Path, step: int, complete: bool = True, max_steps: int = 0) -> Path:
    path = output_dir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    state = json.dumps({"global_step": step, "max_steps": max_steps})
    (path / "trainer_state.json").write_text(state if complete else '{"global_')
    # sealed after the state: its manifest is the last file of a whole save
    if complete:
        seal_checkpoint(path, INPUTS)
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
    assert resolve_resume(resume_of(spec, output_dir), INPUTS) is None
    write_checkpoint(output_dir, 5)
    newest = write_checkpoint(output_dir, 10)
    (output_dir / SPEC_FILE).write_text(json.dumps(spec.model_dump(mode="json")))
    assert resolve_resume(resume_of(spec, output_dir), INPUTS) == str(newest)
    assert resolve_resume(
        resume_of(sft_spec(tmp_path, resume=str(output_dir / "checkpoint-5")), output_dir), INPUTS
    ).endswith("-5")


def test_resume_auto_refuses_a_checkpoint_of_another_spec(tmp_path: Path) -> None:
    spec = sft_spec(tmp_path)
    output_dir = Path(spec.training["output_dir"])
    write_checkpoint(output_dir, 10)
    saved = spec.model_dump(mode="json")
    saved["training"]["learning_rate"] = 0.5
    (output_dir / SPEC_FILE).write_text(json.dumps(saved))
    with pytest.raises(SpecError) as error:
        resolve_resume(resume_of(spec, output_dir), INPUTS)
    assert "written by a different spec (training.learning_rate: 0.5 -> 0.003)" in str(error.value)


def test_resume_never_refuses_to_mix_runs_and_a_bad_path_is_named(tmp_path: Path) -> None:
    spec = sft_spec(tmp_path, resume="never")
    output_dir = Path(spec.training["output_dir"])
    assert resolve_resume(resume_of(spec, output_dir), INPUTS) is None
    write_checkpoint(output_dir, 10)
    with pytest.raises(SpecError, match="resume: never, but .* already holds checkpoints"):
        resolve_resume(resume_of(spec, output_dir), INPUTS)
    with pytest.raises(
        SpecError, match="resume: '.*nowhere' is neither auto, never nor an existing checkpoint directory"
    ):
        resolve_resume(resume_of(sft_spec(tmp_path, resume=str(tmp_path / "nowhere")), output_dir), INPUTS)
    (tmp_path / "half").mkdir()
    with pytest.raises(SpecError, match="is not a complete checkpoint"):
        resolve_resume(resume_of(sft_spec(tmp_path, resume=str(tmp_path / "half")), output_dir), INPUTS)


def test_a_run_is_finished_at_its_last_step_of_max_steps_or_of_its_epochs(tmp_path: Path) -> None:
    # a finished run is left alone: resuming at the last step would take one step too many
    last = write_checkpoint(tmp_path, 40, max_steps=40)
    # no run_summary.json: the final save never happened
    assert not already_finished(tmp_path, last, max_steps=40)
    (tmp_path / SUMMARY_FILE).write_text(json.dumps({"global_steps": 40}))
    assert already_finished(tmp_path, last, max_steps=40)
    # the spec asks for more steps
    assert not already_finished(tmp_path, last, max_steps=60)
    # epochs: the step count the trainer recorded
    assert already_finished(tmp_path, last, max_steps=-1)
    earlier = write_checkpoint(tmp_path, 20, max_steps=40)
    assert not already_finished(tmp_path, earlier, max_steps=-1)


# ---------------------------------------------------------------- a checkpoint is checked before it is trusted


def save_weights(path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"weight": torch.arange(64, dtype=torch.float32)}, str(path))


def cut(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def test_files_cut_short_are_found_from_their_headers(tmp_path: Path) -> None:
    import torch

    weights, state, config = tmp_path / "model.safetensors", tmp_path / "optimizer.pt", tmp_path / "config.json"
    save_weights(weights)
    torch.save({"step": torch.ones(100)}, state)
    config.write_text("{}")
    assert [file_problem(path) for path in (weights, state, config)] == [None, None, None]
    size = weights.stat().st_size
    cut(weights, -10)
    assert file_problem(weights) == f"cut short at {size - 10} of {size} bytes"
    cut(state, -100)
    assert file_problem(state).startswith("not a whole torch file")
    config.write_text('{"a": ')
    assert file_problem(config) == "not valid JSON"
    assert file_problem(tmp_path / "gone.safetensors") == "unreadable (No such file or directory)"


def test_a_damaged_newest_checkpoint_is_named_and_the_previous_whole_one_resumed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = sft_spec(tmp_path)
    output_dir = Path(spec.training["output_dir"])
    for step in (10, 20):
        save_weights(write_checkpoint(output_dir, step) / "model.safetensors")
    cut(output_dir / "checkpoint-20" / "model.safetensors", 100)
    # a user's copy: not ours, left alone
    (output_dir / "checkpoint-best").mkdir()
    (output_dir / SPEC_FILE).write_text(json.dumps(spec.model_dump(mode="json")))
    with caplog.at_level("WARNING", logger="posttrain"):
        assert resolve_resume(resume_of(spec, output_dir), INPUTS) == str(output_dir / "checkpoint-10")
    [line] = caplog.messages
    assert line.startswith(
        f"resume: {output_dir / 'checkpoint-20'} is damaged (model.safetensors: cut short at 100 of "
    )
    assert line.endswith("resuming from checkpoint-10, leaving it as it is")
    # nothing deleted
    assert (output_dir / "checkpoint-20" / "model.safetensors").stat().st_size == 100
    with pytest.raises(SpecError, match=r"checkpoint-20 is not a complete checkpoint: model.safetensors: cut short"):
        resolve_resume(resume_of(sft_spec(tmp_path, resume=str(output_dir / "checkpoint-20")), output_dir), INPUTS)


def write_safetensors(path: Path, header: Any, data: bytes = bytes(16)) -> None:
    """A safetensors file with ``header`` as it is, well formed or not."""
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


def damaged_after_whole(tmp_path: Path) -> Any:
    """The spec, and its output_dir with a whole checkpoint-10 and a checkpoint-20 for the test to damage."""
    spec = sft_spec(tmp_path)
    output_dir = Path(spec.training["output_dir"])
    for step in (10, 20):
        save_weights(write_checkpoint(output_dir, step) / "model.safetensors")
    (output_dir / SPEC_FILE).write_text(json.dumps(spec.model_dump(mode="json")))
    return spec, output_dir


WEIGHT = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
MALFORMED = {
    "a list": ([WEIGHT], "its header is a JSON list, not an object of tensors"),
    "no data_offsets": ({"weight": {"dtype": "F32", "shape": [4]}}, "lacks a dtype, a shape or two integer"),
    "offsets not integers": ({"weight": {**WEIGHT, "data_offsets": ["0", 16.5]}}, "two integer data_offsets"),
    "offsets backwards": ({"weight": {**WEIGHT, "data_offsets": [16, 0]}}, "which do not run forward"),
    "offsets beyond the file": ({"weight": {**WEIGHT, "data_offsets": [0, 4096]}}, "cut short at "),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_safetensors_header_is_damage_and_the_previous_whole_checkpoint_resumed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    header, reason = MALFORMED[case]
    spec, output_dir = damaged_after_whole(tmp_path)
    write_safetensors(output_dir / "checkpoint-20" / "model.safetensors", header)
    with caplog.at_level("WARNING", logger="posttrain"):
        assert resolve_resume(resume_of(spec, output_dir), INPUTS) == str(output_dir / "checkpoint-10")
    [line] = caplog.messages
    assert "checkpoint-20 is damaged (model.safetensors: " in line and reason in line, line


def test_an_index_whose_shard_is_missing_or_cut_short_is_damage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec, output_dir = damaged_after_whole(tmp_path)
    index = {"weight_map": {"a": "model-1-of-2.safetensors", "b": "model-2-of-2.safetensors"}}
    for step in (10, 20):
        (output_dir / f"checkpoint-{step}" / "model.safetensors.index.json").write_text(json.dumps(index))
        save_weights(output_dir / f"checkpoint-{step}" / "model-1-of-2.safetensors")
    # checkpoint-10: whole, sharded
    save_weights(output_dir / "checkpoint-10" / "model-2-of-2.safetensors")
    with caplog.at_level("WARNING", logger="posttrain"):
        assert resolve_resume(resume_of(spec, output_dir), INPUTS) == str(output_dir / "checkpoint-10")
    assert (
        "(model.safetensors.index.json: names 1 shard(s) that are missing (model-2-of-2.safetensors))"
        in (caplog.messages[0])
    )
    shard = output_dir / "checkpoint-10" / "model-2-of-2.safetensors"
    # where shards are judged apart from their index (a local model's files)
    cut(shard, 100)
    assert file_problem(output_dir / "checkpoint-10" / "model.safetensors.index.json") == (
        f"its shard model-2-of-2.safetensors: {file_problem(shard)}"
    )


def sealed_pair(tmp_path: Path) -> Any:
    """The spec, and its output_dir with checkpoint-10 and -20 as two ranks of a sharded run leave them, sealed."""
    import torch

    spec = sft_spec(tmp_path)
    output_dir = Path(spec.training["output_dir"])
    for step in (10, 20):
        checkpoint = write_checkpoint(output_dir, step, complete=False)
        (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        save_weights(checkpoint / "model.safetensors")
        for rank in (0, 1):
            torch.save({"cpu": torch.random.get_rng_state()}, checkpoint / f"rng_state_{rank}.pth")
        (checkpoint / "pytorch_model_fsdp_0").mkdir()
        # no format to check
        (checkpoint / "pytorch_model_fsdp_0" / "__1_0.distcp").write_bytes(bytes(100))
        seal_checkpoint(checkpoint, INPUTS)
    (output_dir / SPEC_FILE).write_text(json.dumps(spec.model_dump(mode="json")))
    return spec, output_dir / "checkpoint-20"


def rename_the_tensor(path: Path) -> None:
    """The same file size, another header: a tensor renamed in place."""
    path.write_bytes(path.read_bytes().replace(b'"weight"', b'"weighs"', 1))


MANIFEST_DAMAGE = {
    "an RNG state missing": (lambda c: (c / "rng_state_1.pth").unlink(), "rng_state_1.pth is missing"),
    "a .distcp shard cut short": (
        lambda c: cut(c / "pytorch_model_fsdp_0" / "__1_0.distcp", 60),
        "pytorch_model_fsdp_0/__1_0.distcp is 60 bytes, its manifest says 100",
    ),
    "a header rewritten": (
        lambda c: rename_the_tensor(c / "model.safetensors"),
        "model.safetensors's safetensors header changed since it was saved",
    ),
    "no manifest": (lambda c: (c / MANIFEST_FILE).unlink(), f"no {MANIFEST_FILE} (its save was interrupted)"),
}


@pytest.mark.parametrize("case", MANIFEST_DAMAGE)
def test_a_file_its_manifest_names_missing_or_changed_is_damage_whatever_its_format(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    damage, reason = MANIFEST_DAMAGE[case]
    spec, checkpoint = sealed_pair(tmp_path)
    assert resolve_resume(resume_of(spec, checkpoint.parent), INPUTS) == str(checkpoint)
    damage(checkpoint)
    with caplog.at_level("WARNING", logger="posttrain"):
        assert resolve_resume(resume_of(spec, checkpoint.parent), INPUTS) == str(checkpoint.parent / "checkpoint-10")
    [line] = caplog.messages
    assert f"checkpoint-20 is damaged ({reason}" in line, line
    # named by path, another tool's checkpoint is judged by its files alone
    if case == "no manifest":
        assert resolve_resume(resume_of(sft_spec(tmp_path, resume=str(checkpoint)), checkpoint.parent), INPUTS) == str(
            checkpoint
        )


def test_a_judge_that_fails_calls_the_checkpoint_damaged_never_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spec, output_dir = damaged_after_whole(tmp_path)
    real = files._safetensors_problem

    def judge(stream: Any, size: int) -> Any:
        if "checkpoint-20" in stream.name:
            raise RuntimeError("a case\nnobody foresaw")
        return real(stream, size)

    monkeypatch.setattr(files, "_safetensors_problem", judge)
    with caplog.at_level("WARNING", logger="posttrain"):
        assert resolve_resume(resume_of(spec, output_dir), INPUTS) == str(output_dir / "checkpoint-10")
    assert "(model.safetensors: could not be checked (RuntimeError: a case nobody foresaw))" in caplog.messages[0]


def test_every_checkpoint_damaged_stops_in_one_line_never_from_step_0(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec, output_dir = damaged_after_whole(tmp_path)
    for step in (30, 40):
        write_checkpoint(output_dir, step, complete=False)
    for step in (10, 20):
        cut(output_dir / f"checkpoint-{step}" / "model.safetensors", 100)
    with caplog.at_level("WARNING", logger="posttrain"), pytest.raises(SpecError) as stopped:
        resolve_resume(resume_of(spec, output_dir), INPUTS)
    assert str(stopped.value) == (
        f"resume: auto found no whole checkpoint in {output_dir}, only damaged ones: checkpoint-40 (no readable "
        "trainer_state.json (its save was interrupted)); checkpoint-30 (no readable trainer_state.json (its save was "
        "interrupted)); checkpoint-20 (model.safetensors: cut short at 100 of 328 bytes); "
        "and 1 more; remove them to start over from step 0, or use another training.output_dir (or resume: never "
        "there)"
    )
    # the one line is the error's
    assert caplog.messages == []
    assert resolve_resume(resume_of(sft_spec(tmp_path, resume="never"), output_dir), INPUTS) is None


# ---------------------------------------------------------------- a finished model, in every resume mode

MODES = ("auto", "never", "path")


def mode_spec(tmp_path: Path, mode: str, **changes: Any) -> Any:
    """The tiny SFT spec with ``resume`` in ``mode`` ("path": a sound checkpoint outside its output_dir)."""
    elsewhere = tmp_path / "elsewhere" / "checkpoint-5"
    if mode == "path" and not elsewhere.exists():
        write_checkpoint(elsewhere.parent, 5)
    return sft_spec(tmp_path, resume=str(elsewhere) if mode == "path" else mode, **changes)


def write_finished(output_dir: Path, spec: Any, checkpoint: bool = True, **training: Any) -> None:
    """What a finished run of ``spec`` (its training keys changed by ``training``) leaves in ``output_dir``."""
    saved = spec.model_dump(mode="json")
    saved["training"].update(training)
    if checkpoint:
        write_checkpoint(output_dir, 40, max_steps=40)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "model.safetensors").write_bytes(b"weights")
    (output_dir / SPEC_FILE).write_text(json.dumps(saved))
    (output_dir / SUMMARY_FILE).write_text(json.dumps({"global_steps": 40, "spec": saved}))


@pytest.mark.parametrize("checkpoint", [True, False], ids=["with checkpoints", "without"])
@pytest.mark.parametrize("mode", MODES)
def test_every_resume_mode_leaves_this_specs_finished_run_as_it_is(tmp_path: Path, mode: str, checkpoint: bool) -> None:
    spec = mode_spec(tmp_path, mode)
    output_dir = Path(spec.training["output_dir"])
    # nothing there yet: train
    assert finished_at(resume_of(spec, output_dir), INPUTS) is None
    write_finished(output_dir, spec, checkpoint=checkpoint)
    assert (
        finished_at(resume_of(spec, output_dir), INPUTS) == 40
        # not trained again in place (or resumed one step too far)
    )


@pytest.mark.parametrize("checkpoint", [True, False], ids=["with checkpoints", "without"])
@pytest.mark.parametrize("mode", MODES)
def test_every_resume_mode_refuses_the_finished_model_of_another_spec(
    tmp_path: Path, mode: str, checkpoint: bool
) -> None:
    spec = mode_spec(tmp_path, mode)
    output_dir = Path(spec.training["output_dir"])
    write_finished(output_dir, spec, checkpoint=checkpoint, learning_rate=0.5)
    with pytest.raises(SpecError) as error:
        finished_at(resume_of(spec, output_dir), INPUTS)
    start_over = "remove its checkpoints and set" if checkpoint else "set"
    assert str(error.value) == (
        f"training.output_dir: {output_dir} holds a finished model written by a different spec "
        "(training.learning_rate: 0.5 -> 0.003); use another training.output_dir, "
        f"or {start_over} overwrite_output_dir: true to train over it"
    )


def test_a_finished_model_of_a_very_different_spec_is_still_one_short_line(tmp_path: Path) -> None:
    spec = sft_spec(tmp_path)
    output_dir = Path(spec.training["output_dir"])
    write_finished(output_dir, spec, checkpoint=False, learning_rate=0.5, max_steps=9, seed=1, warmup_steps=2)
    with pytest.raises(SpecError) as error:
        finished_at(resume_of(spec, output_dir), INPUTS)
    assert (
        "(training.learning_rate: 0.5 -> 0.003; training.max_steps: 9 -> 40; training.seed: 1 -> 0; and 1 more);"
        in (str(error.value))
    )


@pytest.mark.parametrize("mode", MODES)
def test_the_job_checks_a_finished_model_in_every_resume_mode_before_any_model_loads(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from posttrain.entrypoints.inputs.rewards import RewardCheck
    from posttrain.entrypoints.job import checks, spec_parts

    def no_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model was looked at")

    for loader in ("check_weight_shapes", "check_model_paths", "load_tokenizer"):
        monkeypatch.setattr(checks, loader, no_model)
    # what write_checkpoint records it was trained on: the run is this one
    monkeypatch.setattr(checks.checkpoints, "job_inputs", lambda *args: INPUTS)
    spec = mode_spec(tmp_path, mode)
    output_dir = Path(spec.training["output_dir"])
    write_finished(output_dir, spec)
    with caplog.at_level("INFO", logger="posttrain"):
        assert checks.check_inputs(spec, spec_parts.parts(spec), 1, RewardCheck()) is None
    assert f"{output_dir} already holds this run, finished at step 40: nothing to train" in caplog.messages
    write_finished(output_dir, spec, checkpoint=False, learning_rate=0.5)
    with pytest.raises(SpecError, match="holds a finished model written by a different spec"):
        checks.check_inputs(spec, spec_parts.parts(spec), 1, RewardCheck())


@pytest.mark.parametrize(
    "weights",
    [
        "model.safetensors",
        "pytorch_model.bin",
        "model.pt",
        "model.safetensors.index.json",
        "pytorch_model.bin.index.json",
        "adapter_model.safetensors",
        "adapter_model.bin",
    ],
)
@pytest.mark.parametrize("mode", MODES)
def test_every_resume_mode_refuses_weights_posttrain_did_not_write(tmp_path: Path, mode: str, weights: str) -> None:
    spec = mode_spec(tmp_path, mode)
    output_dir = Path(spec.training["output_dir"])
    output_dir.mkdir()
    (output_dir / weights).write_bytes(b"{}")
    (output_dir / "config.json").write_text("{}")
    with pytest.raises(SpecError) as error:
        finished_at(resume_of(spec, output_dir), INPUTS)
    assert str(error.value) == (
        f"training.output_dir: {output_dir} holds weights posttrain did not write ({weights}; no {SPEC_FILE}); "
        "use another training.output_dir, or set overwrite_output_dir: true to write over them"
    )


def test_what_is_not_a_model_in_output_dir_is_no_reason_to_refuse(tmp_path: Path) -> None:
    spec = sft_spec(tmp_path)
    output_dir = Path(spec.training["output_dir"])
    output_dir.mkdir()
    # the Trainer's arguments, not weights
    (output_dir / "training_args.bin").write_bytes(b"args")
    (output_dir / "config.json").write_text("{}")
    (output_dir / "notes.txt").write_text("mine")
    (output_dir / "checkpoint-best").mkdir()
    # not in output_dir itself
    (output_dir / "checkpoint-best" / "model.safetensors").write_bytes(b"weights")
    assert finished_at(resume_of(spec, output_dir), INPUTS) is None
    (output_dir / SPEC_FILE).write_text(json.dumps(spec.model_dump(mode="json")))
    # posttrain's, saved before run_summary.json
    (output_dir / "model.safetensors").write_bytes(b"weights")
    assert finished_at(resume_of(spec, output_dir), INPUTS) is None


@pytest.mark.parametrize("mode", MODES)
def test_overwrite_output_dir_lets_every_resume_mode_write_over_a_model(tmp_path: Path, mode: str) -> None:
    spec = mode_spec(tmp_path, mode, overwrite_output_dir=True)
    output_dir = Path(spec.training["output_dir"])
    output_dir.mkdir()
    (output_dir / "adapter_model.safetensors").write_bytes(b"weights")
    # weights posttrain did not write
    assert finished_at(resume_of(spec, output_dir), INPUTS) is None
    write_finished(output_dir, spec, checkpoint=False, learning_rate=0.5)
    # another spec's finished model
    assert finished_at(resume_of(spec, output_dir), INPUTS) is None
    write_finished(output_dir, spec, checkpoint=False)
    # this spec's: trained again
    assert finished_at(resume_of(spec, output_dir), INPUTS) is None
    assert resolve_resume(resume_of(spec, output_dir), INPUTS) == (spec.resume if mode == "path" else None)


def test_overwrite_output_dir_leaves_checkpoints_to_resume(tmp_path: Path) -> None:
    # a run started over among another run's checkpoints could later resume from one of them: resume still decides
    never = sft_spec(tmp_path, resume="never", overwrite_output_dir=True)
    output_dir = Path(never.training["output_dir"])
    write_finished(output_dir, never, learning_rate=0.5)
    assert finished_at(resume_of(never, output_dir), INPUTS) is None
    with pytest.raises(SpecError, match="resume: never, but .* already holds checkpoints"):
        resolve_resume(resume_of(never, output_dir), INPUTS)
    auto = sft_spec(tmp_path, overwrite_output_dir=True)
    with pytest.raises(SpecError, match=r"resume: auto found .*checkpoint-40 written by a different spec"):
        resolve_resume(resume_of(auto, output_dir), INPUTS)
    # as the refusal without overwrite_output_dir says
    shutil.rmtree(output_dir / "checkpoint-40")
    assert resolve_resume(resume_of(never, output_dir), INPUTS) is None
    assert resolve_resume(resume_of(auto, output_dir), INPUTS) is None


def test_this_specs_finished_model_trained_on_other_inputs_is_refused(tmp_path: Path) -> None:
    spec = sft_spec(tmp_path)
    output_dir = Path(spec.training["output_dir"])
    write_finished(output_dir, spec)
    assert finished_at(resume_of(spec, output_dir), INPUTS) == 40
    doubled = {**INPUTS, "global_batch": {**INPUTS["global_batch"], "processes": 2}}
    with pytest.raises(SpecError) as error:
        finished_at(resume_of(spec, output_dir), doubled)
    assert str(error.value) == (
        f"training.output_dir: {output_dir} holds this spec's finished model, but the global batch was 4 (1 x 4 x 1: "
        "processes x per device x accumulation) and is now 8 (2 x 4 x 1: processes x per device x accumulation); "
        "use another training.output_dir, or remove its checkpoints and set overwrite_output_dir: true to train over it"
    )


def test_overwrite_output_dir_is_posttrains_key_at_the_top_of_the_spec(tmp_path: Path) -> None:
    # transformers 5's TrainingArguments has no overwrite_output_dir: in training it would reach no trainer
    raw = load_template("sft/tiny.yaml")
    assert validate(apply_overrides(raw, ["overwrite_output_dir=true"])).overwrite_output_dir is True
    assert validate(raw).overwrite_output_dir is False
    raw["training"]["overwrite_output_dir"] = True
    with pytest.raises(SpecError) as error:
        validate(raw)
    assert str(error.value) == (
        "training.overwrite_output_dir: set by posttrain, not in training; use overwrite_output_dir at the top level "
        "of the spec"
    )
    # a resume may differ in it: it changes what may be written over, not what is trained
    spec = sft_spec(tmp_path, overwrite_output_dir=True)
    output_dir = Path(spec.training["output_dir"])
    checkpoint = write_checkpoint(output_dir, 10)
    (output_dir / SPEC_FILE).write_text(json.dumps(sft_spec(tmp_path).model_dump(mode="json")))
    assert resolve_resume(resume_of(spec, output_dir), INPUTS) == str(checkpoint)


def batch_of(processes: int) -> Dict[str, int]:
    return {"processes": processes, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}


def test_resume_auto_stops_where_the_data_or_the_global_batch_changed(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    shutil.copy(REPO / "templates/data/sft_chat.jsonl", data)
    spec = sft_spec(tmp_path, data={"train": {"path": str(data)}})
    output_dir = Path(spec.training["output_dir"])
    inputs = job_inputs(resume_of(spec, output_dir), batch_of(2), [("data.train", None)])
    checkpoint = write_checkpoint(output_dir, 10)
    (output_dir / SPEC_FILE).write_text(json.dumps(spec.model_dump(mode="json")))
    seal_checkpoint(checkpoint, inputs)
    assert resolve_resume(resume_of(spec, output_dir), inputs) == str(checkpoint)

    halved = job_inputs(resume_of(spec, output_dir), batch_of(1), [("data.train", None)])
    with pytest.raises(SpecError) as error:
        resolve_resume(resume_of(spec, output_dir), halved)
    assert "the global batch was 16 (2 x 8 x 1: processes x per device x accumulation) and is now 8 (1 x 8 x 1" in str(
        error.value
    )

    data.write_text(data.read_text().replace("a", "b", 1))
    edited = job_inputs(resume_of(spec, output_dir), batch_of(2), [("data.train", None)])
    with pytest.raises(SpecError) as error:
        resolve_resume(resume_of(spec, output_dir), edited)
    assert str(error.value).startswith(
        f"resume: auto found {checkpoint}, but data.train ({data}) changed since it was saved;"
    )
    continued = sft_spec(tmp_path, data={"train": {"path": str(data)}}, resume=str(checkpoint))
    # a path continues anyway
    assert resolve_resume(resume_of(continued, output_dir), edited) == str(checkpoint)


def test_write_failures_for_want_of_room_end_in_one_line(tmp_path: Path) -> None:
    import errno

    with pytest.raises(SpecError) as error:
        with disk_errors(tmp_path):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert error.value.this_rank_only
    assert str(error.value).startswith(
        f"training.output_dir: writing into {tmp_path} failed: No space left on device ("
    )
    with pytest.raises(SpecError, match="failed: the write failed"):
        with disk_errors(tmp_path):
            raise RuntimeError(
                "[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0; basic_ios::clear: iostream error"
            )
    # any other error keeps its traceback
    with pytest.raises(OSError):
        with disk_errors(tmp_path):
            raise OSError(errno.EACCES, "Permission denied")


def names(output_dir: Path) -> List[str]:
    return sorted(path.name for path in output_dir.iterdir())


def test_rotation_keeps_the_newest_whole_checkpoints_and_leaves_a_users_checkpoint_best_alone(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        write_checkpoint(tmp_path, step)
    # crashed a rotation once: int("best")
    (tmp_path / "checkpoint-best").mkdir()
    rotate_checkpoints(tmp_path, 2, None)
    assert names(tmp_path) == ["checkpoint-20", "checkpoint-30", "checkpoint-best"]
    # no limit, or not reached: nothing goes
    rotate_checkpoints(tmp_path, None, None)
    rotate_checkpoints(tmp_path, 2, None)
    assert names(tmp_path) == ["checkpoint-20", "checkpoint-30", "checkpoint-best"]


def test_rotation_counts_whole_checkpoints_only_and_keeps_the_best_as_the_trainer_does(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        write_checkpoint(tmp_path, step)
    # cut short, say by a full disk, or not sealed yet: they count for nothing and stay
    for step in (50, 60):
        write_checkpoint(tmp_path, step, complete=False)
    rotate_checkpoints(tmp_path, 2, str(tmp_path / "checkpoint-20"))
    # the best and the newest whole one; what came before the best goes
    assert names(tmp_path) == ["checkpoint-20", "checkpoint-40", "checkpoint-50", "checkpoint-60"]
    rotate_checkpoints(tmp_path, 1, str(tmp_path / "checkpoint-20"))
    assert names(tmp_path) == ["checkpoint-20", "checkpoint-40", "checkpoint-50", "checkpoint-60"]


def test_a_rotation_cut_short_leaves_no_checkpoint_resume_could_take_and_the_next_one_clears_it(
    tmp_path: Path,
) -> None:
    for step in (10, 20):
        write_checkpoint(tmp_path, step)
    # what a kill in the middle of a removal leaves: the folder renamed, part of it removed
    half = tmp_path / ".posttrain-removing-checkpoint-5"
    half.mkdir()
    (half / "optimizer.pt").write_bytes(b"half")
    assert [path.name for path in complete_checkpoints(tmp_path)] == ["checkpoint-10", "checkpoint-20"]
    rotate_checkpoints(tmp_path, 1, None)
    assert names(tmp_path) == ["checkpoint-20"]
