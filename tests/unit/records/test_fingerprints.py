"""Each run knows what it was trained from by content: a fingerprint per model and data source that any changed
byte changes, read once per file while the file is unchanged; a finished run whose input changed is not finished."""

import json
import os
import struct
from pathlib import Path
from typing import Any, Dict

import pytest

from helpers import resume_of, sft_spec
from posttrain.components.spec.loading import SpecError
from posttrain.components.spec.sections import DataSource
from posttrain.entrypoints.records import fingerprints
from posttrain.entrypoints.records.checkpoints import INPUTS_FILE, SPEC_FILE, finished_at, job_inputs, stale_runs
from posttrain.entrypoints.records.fingerprints import data_fingerprint, file_digest, model_fingerprint
from posttrain.entrypoints.records.summary import SUMMARY_FILE

BATCH = {"processes": 1, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1}


@pytest.fixture(autouse=True)
def fresh_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with nothing read, as a new process does."""
    monkeypatch.setattr(fingerprints, "_DIGESTS", {})


def write_safetensors(path: Path, shape: list, data_bytes: int, fill: bytes = b"\0") -> None:
    """A safetensors file of one float32 tensor: the header's length, the header, then the data."""
    header = json.dumps({"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, data_bytes]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + fill * data_bytes)


def model_dir(root: Path) -> Path:
    """A local model directory: two shards, their index, a config and a tokenizer."""
    root.mkdir(parents=True)
    for shard in (1, 2):
        write_safetensors(root / f"model-0000{shard}-of-00002.safetensors", [256, 256], 256 * 256 * 4)
    (root / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    (root / "config.json").write_text('{"hidden_size": 4}')
    (root / "tokenizer.json").write_text('{"model": {}}')
    return root


def edit_in_place(path: Path, offset: int, byte: bytes) -> None:
    """One byte changed where it lies, the file's size and modification time as they were (``touch -r``)."""
    stat = path.stat()
    with path.open("r+b") as stream:
        stream.seek(offset)
        stream.write(byte)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_any_byte_of_any_shard_changes_a_model_s_fingerprint_even_with_its_size_and_time_kept(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "model")
    before = model_fingerprint(str(model))
    assert model_fingerprint(str(model)) == before
    assert set(before["files"]) == {
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "config.json",
        "tokenizer.json",
    }
    shard = model / "model-00002-of-00002.safetensors"
    # a weight in the middle of the second shard: neither its header nor its first or last bytes
    middle = shard.stat().st_size // 2
    edit_in_place(shard, middle, b"\1")
    assert model_fingerprint(str(model)) != before
    edit_in_place(shard, middle, b"\0")
    assert model_fingerprint(str(model)) == before
    (model / "tokenizer.json").write_text('{"model": {"vocab": {}}}')
    assert model_fingerprint(str(model)) != before


def test_a_posttrain_run_s_model_is_known_by_its_content_not_its_run_id(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "model")
    (model / SUMMARY_FILE).write_text(json.dumps({"run_id": "abc", "global_steps": 40}))
    before = model_fingerprint(str(model))
    edit_in_place(model / "model-00001-of-00002.safetensors", 1000, b"\7")
    # the same run's id, other weights
    assert model_fingerprint(str(model)) != before
    assert model_fingerprint("Qwen/Qwen2.5-0.5B", "main") == {"source": "Qwen/Qwen2.5-0.5B", "revision": "main"}
    assert model_fingerprint("builtin:tiny-llama") == {"source": "builtin:tiny-llama", "revision": None}


def test_a_file_read_once_is_not_read_again_while_unchanged_and_is_once_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "a"}\n' * 1000)
    first = file_digest(data)
    # what a record keeps, read back by a later process
    recorded = {"seen": json.loads(json.dumps(fingerprints.seen()))}
    monkeypatch.setattr(fingerprints, "_DIGESTS", {})
    fingerprints.remember(recorded)
    opened = []
    original = Path.open

    def counted(path: Path, *args: Any, **kwargs: Any) -> Any:
        opened.append(path)
        return original(path, *args, **kwargs)

    monkeypatch.setattr(Path, "open", counted)
    assert file_digest(data) == first and opened == []
    # changed in place, its size and modification time kept: its change time tells
    edit_in_place(data, 5, b"q")
    opened.clear()
    assert file_digest(data) != first and opened == [data]


def test_local_data_is_known_by_every_file_s_content_a_hub_data_set_by_what_loaded(tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    # past the size an older posttrain hashed whole (64 MiB), sparse
    with big.open("wb") as stream:
        stream.truncate(65 << 20)
    single = data_fingerprint(DataSource(path=str(big)), None)
    assert set(single) == {"source", "bytes", "sha256"}
    edit_in_place(big, 33 << 20, b"x")
    assert data_fingerprint(DataSource(path=str(big)), None) != single

    saved = tmp_path / "saved"
    (saved / "train").mkdir(parents=True)
    (saved / "train" / "data-00000-of-00001.arrow").write_bytes(b"rows")
    (saved / "dataset_dict.json").write_text('{"splits": ["train"]}')
    directory = data_fingerprint(DataSource(path=str(saved)), None)
    assert set(directory["files"]) == {"train/data-00000-of-00001.arrow", "dataset_dict.json"}
    edit_in_place(saved / "train" / "data-00000-of-00001.arrow", 0, b"R")
    assert data_fingerprint(DataSource(path=str(saved)), None) != directory

    (tmp_path / "part-1.jsonl").write_text("{}\n")
    (tmp_path / "part-2.jsonl").write_text("{}\n")
    matched = data_fingerprint(DataSource(path=str(tmp_path / "part-*.jsonl")), None)
    assert sorted(matched["files"]) == [str(tmp_path / "part-1.jsonl"), str(tmp_path / "part-2.jsonl")]

    class Loaded:
        _fingerprint = "abc123"

    assert data_fingerprint(DataSource(name="openai/gsm8k"), Loaded()) == {
        "source": "openai/gsm8k",
        "fingerprint": "abc123",
    }


def finished_run(tmp_path: Path, models: Dict[str, Any], data: Dict[str, Any]) -> Any:
    """A finished SFT run of a local model on a local file, its summary recording ``models`` and ``data`` as what
    it was trained from and on."""
    rows = tmp_path / "rows.jsonl"
    if not rows.exists():
        rows.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    spec = sft_spec(tmp_path, model={"name_or_path": str(tmp_path / "model")}, data={"train": {"path": str(rows)}})
    output_dir = Path(spec.training["output_dir"])
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "model.safetensors").write_bytes(b"weights")
    (output_dir / SPEC_FILE).write_text(json.dumps(spec.model_dump(mode="json")))
    inputs = {"data": data, "models": models, "global_batch": BATCH}
    summary = {"global_steps": 40, "spec": spec.model_dump(mode="json"), "inputs": inputs}
    (output_dir / SUMMARY_FILE).write_text(json.dumps(summary))
    return spec


def inputs_of(spec: Any) -> Dict[str, Any]:
    return job_inputs(resume_of(spec, Path(spec.training["output_dir"])), BATCH, [("data.train", None)])


def test_a_finished_run_whose_model_or_data_changed_is_refused_naming_it_and_is_stale_in_a_chain(
    tmp_path: Path,
) -> None:
    model = model_dir(tmp_path / "model")
    spec = finished_run(tmp_path, {}, {})
    recorded = inputs_of(spec)
    spec = finished_run(tmp_path, recorded["models"], recorded["data"])
    output_dir = Path(spec.training["output_dir"])
    resume = resume_of(spec, output_dir)
    stale = lambda: stale_runs(spec.named_models(), spec.model.revision, spec.data, output_dir)  # noqa: E731
    # the same inputs: nothing to train
    assert finished_at(resume, inputs_of(spec)) == 40
    assert stale() == ([], [])

    edit_in_place(model / "model-00002-of-00002.safetensors", 4000, b"\1")
    with pytest.raises(SpecError) as error:
        finished_at(resume, inputs_of(spec))
    assert str(error.value) == (
        f"training.output_dir: {output_dir} holds this spec's finished model, but model.name_or_path ({model}) is "
        "not the model it was trained from; use another training.output_dir, or set overwrite_output_dir: true to "
        "train over it"
    )
    changes = [f"model.name_or_path ({model}) is not the model it was trained from"]
    assert stale() == (changes, [output_dir / SUMMARY_FILE])
    checkpoint = output_dir / "checkpoint-40"
    checkpoint.mkdir()
    (checkpoint / INPUTS_FILE).write_text(json.dumps({"models": {"model.name_or_path": {"source": "old"}}}))
    assert stale() == (changes, [output_dir / SUMMARY_FILE, checkpoint])
    edit_in_place(model / "model-00002-of-00002.safetensors", 4000, b"\0")
    (checkpoint / INPUTS_FILE).unlink()
    checkpoint.rmdir()

    rows = Path(spec.data.train.path)
    edit_in_place(rows, 2, b"M")
    assert stale() == ([f"data.train ({rows}) changed since it was saved"], [output_dir / SUMMARY_FILE])


def test_a_finished_run_an_older_posttrain_recorded_stays_finished(tmp_path: Path) -> None:
    model_dir(tmp_path / "model")
    # which named no models, or a model by its run's id and its weights by samples of their bytes
    for models in ({}, {"model.name_or_path": {"source": str(tmp_path / "model"), "run_id": "abc"}}):
        spec = finished_run(tmp_path, models, {})
        output_dir = Path(spec.training["output_dir"])
        assert finished_at(resume_of(spec, output_dir), {**inputs_of(spec), "data": {}}) == 40
