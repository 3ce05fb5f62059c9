"""Durable ends: files written whole and fsynced, the final model moved in before ``run_summary.json``, a checkpoint
complete only with its inputs' record, and a damaged record of posttrain's own said in one line. (The kill during a
real final save: ``tests/e2e/test_reliability.py``.)"""

import json
import os
import re
from pathlib import Path
from typing import List

import pytest

from helpers import resume_of, sft_spec
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.job.callbacks import FaultInjection
from posttrain.entrypoints.records.checkpoints import (
    INPUTS_FILE,
    PREVIOUS_RUNS,
    SPEC_FILE,
    complete_checkpoints,
    resolve_resume,
    seal_checkpoint,
    set_aside_previous_run,
)
from posttrain.entrypoints.records.files import write_json_atomic
from posttrain.entrypoints.records.final_model import publish_final
from posttrain.entrypoints.records.summary import SUMMARY_FILE

INPUTS = {
    "data": {},
    "global_batch": {"processes": 1, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1},
}


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> List[Path]:
    """The paths os.fsync is called on, in order."""
    paths: List[Path] = []
    real = os.fsync

    def record(descriptor: int) -> None:
        paths.append(Path(os.readlink(f"/proc/self/fd/{descriptor}")))
        real(descriptor)

    monkeypatch.setattr(os, "fsync", record)
    return paths


def test_write_json_atomic_fsyncs_the_file_then_its_directory(tmp_path: Path, fsynced: List[Path]) -> None:
    path = tmp_path / "record.json"
    path.write_text("old")
    write_json_atomic(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    # the data before the rename that names it; the temporary file this process's alone
    temporary, directory = fsynced
    assert re.fullmatch(rf"record\.json\.{os.getpid()}-[0-9a-f]{{8}}\.tmp", temporary.name) and directory == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def staged(output_dir: Path) -> Path:
    staging = output_dir / ".posttrain-final"
    (staging / "value_model").mkdir(parents=True)
    (staging / "config.json").write_text('{"new": true}')
    (staging / "model.safetensors").write_bytes(b"new weights")
    (staging / "value_model" / "model.safetensors").write_bytes(b"new value")
    return staging


def test_the_final_model_is_moved_in_fsynced_and_a_kill_mid_way_leaves_no_summary(
    tmp_path: Path, fsynced: List[Path]
) -> None:
    output_dir = tmp_path / "out"
    (output_dir / "value_model").mkdir(parents=True)
    (output_dir / "value_model" / "old.bin").write_bytes(b"old")
    (output_dir / "model.safetensors").write_bytes(b"old weights")
    # a finished run being trained over
    (output_dir / SUMMARY_FILE).write_text('{"global_steps": 3}')
    staging = staged(output_dir)

    def killed() -> None:
        # stands for the SIGKILL the e2e test sends
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        publish_final(staging, output_dir, killed)
    # mid-way: old and new files mixed, but nothing says the run finished
    assert not (output_dir / SUMMARY_FILE).exists()
    assert (output_dir / "config.json").read_text() == '{"new": true}'
    assert (output_dir / "model.safetensors").read_bytes() == b"old weights"
    # every staged file and folder was fsynced before the first rename
    assert {staging / "model.safetensors", staging / "value_model" / "model.safetensors", staging} <= set(fsynced)

    # a fresh staging, as the next attempt saves it
    staging = staged(output_dir / "again")
    publish_final(staging, output_dir)
    assert (output_dir / "model.safetensors").read_bytes() == b"new weights"
    assert sorted(p.name for p in (output_dir / "value_model").iterdir()) == ["model.safetensors"]
    # the renames made durable
    assert not staging.exists() and fsynced[-1] == output_dir


def test_a_model_file_the_new_model_lacks_goes_when_it_is_published(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    # another model's: a shard, its index, an adapter, a tokenizer file
    others = ["model-00002-of-00002.safetensors", "model.safetensors.index.json", "adapter_config.json"]
    others += ["adapter_model.safetensors", "tokenizer.model"]
    for name in [*others, "model.safetensors", "notes.txt", "metrics.jsonl"]:
        (output_dir / name).write_text("old")
    publish_final(staged(output_dir), output_dir)
    assert sorted(p.name for p in output_dir.iterdir()) == [
        "config.json",
        "metrics.jsonl",
        "model.safetensors",
        "notes.txt",
        "value_model",
    ]
    assert (output_dir / "model.safetensors").read_bytes() == b"new weights"


def test_a_previous_run_is_set_aside_whole_its_summary_first_its_checkpoints_and_logs_left(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    (output_dir / "logs").mkdir(parents=True)
    (output_dir / "checkpoint-4").mkdir()
    for name in (
        SUMMARY_FILE,
        "adapter_model.safetensors",
        "adapter_config.json",
        "README.md",
        ".posttrain_lease.json",
    ):
        (output_dir / name).write_text(name)
    moved: List[str] = []
    replace = os.replace

    def recorded(source: Path, target: Path) -> None:
        moved.append(Path(source).name)
        replace(source, target)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "replace", recorded)
        aside = set_aside_previous_run(output_dir)
    assert aside.parent == output_dir / PREVIOUS_RUNS and moved[0] == SUMMARY_FILE
    assert sorted(p.name for p in aside.iterdir()) == sorted(
        [SUMMARY_FILE, "README.md", "adapter_config.json", "adapter_model.safetensors"]
    )
    assert sorted(p.name for p in output_dir.iterdir()) == sorted(
        [".posttrain_lease.json", "checkpoint-4", "logs", PREVIOUS_RUNS]
    )
    # nothing more to move: none made; a second run set aside beside the first
    assert set_aside_previous_run(output_dir) is None
    (output_dir / "model.safetensors").write_text("second")
    assert set_aside_previous_run(output_dir) != aside and len(list((output_dir / PREVIOUS_RUNS).iterdir())) == 2


def write_checkpoint(output_dir: Path, step: int, sealed: bool = True) -> Path:
    path = output_dir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if sealed:
        seal_checkpoint(path, INPUTS)
    return path


def test_a_checkpoint_of_this_run_without_its_manifest_is_incomplete(tmp_path: Path) -> None:
    """A kill before the manifest (the trainer's files, even the inputs' record, all there): resume: auto takes
    the checkpoint before."""
    spec = sft_spec(tmp_path)
    output_dir = Path(spec.training["output_dir"])
    before = write_checkpoint(output_dir, 10)
    cut = write_checkpoint(output_dir, 20, sealed=False)
    (cut / INPUTS_FILE).write_text(json.dumps(INPUTS))
    (output_dir / SPEC_FILE).write_text(json.dumps(spec.model_dump(mode="json")))
    assert complete_checkpoints(output_dir) == [before]
    assert resolve_resume(resume_of(spec, output_dir), INPUTS) == str(before)
    # named by path, a checkpoint needs no record (another tool's)
    assert resolve_resume(resume_of(sft_spec(tmp_path, resume=str(cut)), output_dir), INPUTS) == str(cut)


@pytest.mark.parametrize("text", ['{"algorithm": "sf', "", "[]", "\xff\xfe"])
def test_a_damaged_spec_record_is_one_line_naming_it_and_what_to_do(tmp_path: Path, text: str) -> None:
    spec = sft_spec(tmp_path)
    output_dir = Path(spec.training["output_dir"])
    write_checkpoint(output_dir, 10)
    (output_dir / SPEC_FILE).write_bytes(text.encode("latin-1"))
    with pytest.raises(SpecError) as error:
        resolve_resume(resume_of(spec, output_dir), INPUTS)
    assert str(error.value) == (
        f"{output_dir / SPEC_FILE} is cut short or not what posttrain wrote; remove it and set resume to a "
        "checkpoint's path to continue, or use another training.output_dir"
    )


def test_the_final_save_fault_is_a_kill_and_nothing_else(tmp_path: Path) -> None:
    assert FaultInjection("kill:0:final", tmp_path).step == -1
    with pytest.raises(SpecError):
        FaultInjection("raise:0:final", tmp_path)
