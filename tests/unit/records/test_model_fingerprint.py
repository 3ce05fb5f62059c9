"""Each run knows the models it was trained from: a cheap fingerprint per model, and a finished run whose model
changed since is not finished."""

import json
import struct
import time
from pathlib import Path
from typing import Any, Dict

import pytest

from helpers import fingerprints_of, resume_of, sft_spec
from posttrain.components.spec.loading import SpecError
from posttrain.entrypoints.records.checkpoints import (
    INPUTS_FILE,
    SPEC_FILE,
    finished_at,
    model_fingerprint,
    stale_runs,
)
from posttrain.entrypoints.records.summary import SUMMARY_FILE

BATCH = {"processes": 1, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1}


def write_safetensors(path: Path, shape: list, data_bytes: int, fill: bytes = b"\0") -> None:
    """A safetensors file of one float32 tensor: the header's length, the header, then the data."""
    header = json.dumps({"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, data_bytes]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + fill * data_bytes)


def model_dir(root: Path) -> Path:
    """A local model directory posttrain did not write (no run_summary.json)."""
    root.mkdir(parents=True)
    write_safetensors(root / "model.safetensors", [4, 4], 64)
    (root / "config.json").write_text('{"hidden_size": 4}')
    (root / "tokenizer.json").write_text('{"model": {}}')
    return root


def test_a_model_directory_s_fingerprint_changes_with_its_header_size_data_or_config(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "model")
    before = model_fingerprint(str(model))
    # untouched: the same
    assert model_fingerprint(str(model)) == before
    assert set(before["files"]) == {"model.safetensors", "config.json", "tokenizer.json"}

    changes = {
        "header": lambda: write_safetensors(model / "model.safetensors", [2, 8], 64),
        "size": lambda: write_safetensors(model / "model.safetensors", [4, 5], 80),
        "data": lambda: write_safetensors(model / "model.safetensors", [4, 4], 64, fill=b"\1"),
        "config": lambda: (model / "config.json").write_text('{"hidden_size": 8}'),
        "tokenizer": lambda: (model / "tokenizer.json").write_text('{"model": {"vocab": {}}}'),
    }
    for what, change in changes.items():
        change()
        assert model_fingerprint(str(model)) != before, what
        write_safetensors(model / "model.safetensors", [4, 4], 64)
        (model / "config.json").write_text('{"hidden_size": 4}')
        (model / "tokenizer.json").write_text('{"model": {}}')
        assert model_fingerprint(str(model)) == before, what


def test_a_posttrain_run_s_model_is_known_by_its_run_id_and_a_hub_model_by_its_name_and_revision(
    tmp_path: Path,
) -> None:
    model = model_dir(tmp_path / "model")
    (model / SUMMARY_FILE).write_text(json.dumps({"run_id": "abc", "global_steps": 40}))
    assert model_fingerprint(str(model)) == {"source": str(model), "run_id": "abc"}
    assert model_fingerprint("Qwen/Qwen2.5-0.5B", "main") == {"source": "Qwen/Qwen2.5-0.5B", "revision": "main"}
    assert model_fingerprint("builtin:tiny-llama") == {"source": "builtin:tiny-llama", "revision": None}


def test_a_big_weight_file_is_fingerprinted_without_reading_it(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "model")
    big = model / "model-00001-of-00002.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [1 << 30, 4], "data_offsets": [0, 16 << 30]}}).encode()
    big.write_bytes(struct.pack("<Q", len(header)) + header)
    with big.open("r+b") as stream:
        # 16 GiB, sparse
        stream.truncate(8 + len(header) + (16 << 30))
    started = time.monotonic()
    fingerprint = model_fingerprint(str(model))
    assert time.monotonic() - started < 1.0
    assert fingerprint["files"][big.name]["bytes"] == 8 + len(header) + (16 << 30)


def finished_run(tmp_path: Path, models: Dict[str, Any]) -> Any:
    """A finished SFT run of a local model, its summary recording ``models`` as what it was trained from."""
    spec = sft_spec(tmp_path, model={"name_or_path": str(tmp_path / "model")})
    output_dir = Path(spec.training["output_dir"])
    output_dir.mkdir(parents=True)
    (output_dir / "model.safetensors").write_bytes(b"weights")
    (output_dir / SPEC_FILE).write_text(json.dumps(spec.model_dump(mode="json")))
    inputs = {"data": {}, "models": models, "global_batch": BATCH}
    summary = {"global_steps": 40, "spec": spec.model_dump(mode="json"), "inputs": inputs}
    (output_dir / SUMMARY_FILE).write_text(json.dumps(summary))
    return spec


def test_a_finished_run_whose_model_changed_is_refused_naming_the_model(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "model")
    spec = finished_run(tmp_path, fingerprints_of(sft_spec(tmp_path, model={"name_or_path": str(model)})))
    output_dir = Path(spec.training["output_dir"])
    inputs = {"data": {}, "models": fingerprints_of(spec), "global_batch": BATCH}
    # the same model: nothing to train
    assert finished_at(resume_of(spec, output_dir), inputs) == 40
    assert stale_runs(spec.named_models(), spec.model.revision, output_dir) == ([], [])

    # the model changed since
    (model / "config.json").write_text('{"hidden_size": 8}')
    inputs = {"data": {}, "models": fingerprints_of(spec), "global_batch": BATCH}
    with pytest.raises(SpecError) as error:
        finished_at(resume_of(spec, output_dir), inputs)
    assert str(error.value) == (
        f"training.output_dir: {output_dir} holds this spec's finished model, but model.name_or_path ({model}) is "
        "not the model it was trained from; use another training.output_dir, or set overwrite_output_dir: true to "
        "train over it"
    )
    changes = [f"model.name_or_path ({model}) is not the model it was trained from"]
    assert stale_runs(spec.named_models(), spec.model.revision, output_dir) == (changes, [output_dir / SUMMARY_FILE])
    checkpoint = output_dir / "checkpoint-40"
    checkpoint.mkdir()
    (checkpoint / INPUTS_FILE).write_text(json.dumps({"models": {"model.name_or_path": {"source": "old"}}}))
    assert stale_runs(spec.named_models(), spec.model.revision, output_dir) == (
        changes,
        [output_dir / SUMMARY_FILE, checkpoint],
    )


def test_a_finished_run_that_records_no_models_stays_finished(tmp_path: Path) -> None:
    model_dir(tmp_path / "model")
    # as an older posttrain's summary, which named none
    spec = finished_run(tmp_path, {})
    output_dir = Path(spec.training["output_dir"])
    inputs = {"data": {}, "models": fingerprints_of(spec), "global_batch": BATCH}
    assert finished_at(resume_of(spec, output_dir), inputs) == 40
