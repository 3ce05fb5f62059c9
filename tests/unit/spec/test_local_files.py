"""The client checks the data and model directories it can read before it submits, in the job's own words; what it
cannot see, the job does."""

import json
from pathlib import Path
from typing import Dict, List

import pytest

from helpers import TEMPLATES
from posttrain.components import algorithms
from posttrain.components.spec import local_files
from posttrain.components.spec.loading import load_spec
from posttrain.components.spec.messages import SpecError

SFT = str(TEMPLATES / "sft/tiny.yaml")
EVALUATES = ("training.eval_strategy=steps", "training.eval_steps=10")


def _jsonl(rows: List[dict]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def _saved(path: Path, splits: List[str]) -> None:
    """What datasets' save_to_disk writes of a DatasetDict, as far as the client reads it."""
    path.mkdir()
    (path / "dataset_dict.json").write_text(json.dumps({"splits": splits}))
    for split in splits:
        (path / split).mkdir()
        (path / split / "state.json").write_text("{}")
        (path / split / "dataset_info.json").write_text(json.dumps({"features": {"question": {}, "answer": {}}}))


# name: (how the data is written, the overrides that point the spec at it, what the client says)
BAD_DATA: Dict[str, tuple] = {
    "a line that is not JSON": (
        lambda p: (p / "d.jsonl").write_text('{"text": "a"}\n{"text": "b"\n'),
        ["data.train.path={d}/d.jsonl"],
        "data.train.path: {d}/d.jsonl line 2 is not valid JSON (Expecting ',' delimiter, column 13)",
    ),
    "not UTF-8": (
        lambda p: (p / "d.jsonl").write_bytes(b'{"text": "caf\xe9"}\n'),
        ["data.train.path={d}/d.jsonl"],
        "data.train.path: {d}/d.jsonl is not UTF-8 text: byte 0xe9 at offset 13 (line 1); save it as UTF-8",
    ),
    "empty": (
        lambda p: (p / "d.jsonl").write_text("\n\n"),
        ["data.train.path={d}/d.jsonl"],
        "data.train: {d}/d.jsonl is empty (blank lines only)",
    ),
    "other columns": (
        lambda p: (p / "d.jsonl").write_text(_jsonl([{"question": "q", "answer": "a"}])),
        ["data.train.path={d}/d.jsonl"],
        "data.train: found columns ['question', 'answer']; expected (messages) or (text) or (prompt, "
        "completion) (map names with data.columns)",
    ),
    "a rename of a column it lacks": (
        lambda p: (p / "d.jsonl").write_text(_jsonl([{"text": "t"}])),
        ["data.train.path={d}/d.jsonl", "data.columns={{query: prompt}}"],
        "data.columns: data.train has no column query; found ['text']",
    ),
    "a CSV's header": (
        lambda p: (p / "d.csv").write_text("question,answer\nq,a\n"),
        ["data.train.path={d}/d.csv"],
        "data.train: found columns ['question', 'answer']; expected",
    ),
    "another suffix": (
        lambda p: (p / "d.txt").write_text("text\n"),
        ["data.train.path={d}/d.txt"],
        "data.train.path: {d}/d.txt: expected a .json, .jsonl, .parquet or .csv file",
    ),
    "a directory that is no saved data set": (
        lambda p: (p / "d").mkdir(),
        ["data.train.path={d}/d"],
        "data.train.path: {d}/d is a directory, but not one datasets' save_to_disk wrote",
    ),
    "a saved data set without the split": (
        lambda p: _saved(p / "d", ["train"]),
        ["data.train.path={d}/d", "data.train.split=test"],
        "data.train.split: {d}/d has no split 'test'; it has train",
    ),
    "a saved data set's columns": (
        lambda p: _saved(p / "d", ["train"]),
        ["data.train.path={d}/d"],
        "data.train: found columns ['question', 'answer']; expected",
    ),
    "evaluation data too": (
        lambda p: (p / "e.jsonl").write_text(_jsonl([{"prompt": "p"}])),
        ["data.eval.path={d}/e.jsonl", "training.eval_strategy=steps", "training.eval_steps=10"],
        "data.eval: found columns ['prompt']; expected",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_DATA))
def test_data_the_client_can_read_is_checked_before_it_submits(tmp_path: Path, case: str) -> None:
    write, overrides, message = BAD_DATA[case]
    write(tmp_path)
    overrides = [override.format(d=tmp_path) for override in overrides]
    with pytest.raises(SpecError) as error:
        algorithms.sft(*overrides, spec=SFT)
    assert len(error.value.problems) == 1 and error.value.problems[0].startswith(message.format(d=tmp_path)), (
        error.value.problems
    )


def test_the_job_says_the_same_words(tmp_path: Path) -> None:
    from posttrain.entrypoints.inputs.data import load_data

    for case in ("a line that is not JSON", "not UTF-8", "empty", "other columns", "a rename of a column it lacks"):
        case_dir = tmp_path / case.replace(" ", "-")
        case_dir.mkdir()
        write, overrides, _ = BAD_DATA[case]
        write(case_dir)
        spec = load_spec(SFT, [o.format(d=case_dir) for o in overrides])
        with pytest.raises(SpecError) as client:
            algorithms.sft(*[o.format(d=case_dir) for o in overrides], spec=SFT)
        with pytest.raises(SpecError) as job:
            load_data(spec.data.train, spec.data.columns, "data.train", spec.data_formats)
        assert client.value.problems == job.value.problems, case


def test_what_the_client_cannot_see_or_read_whole_is_left_to_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an absolute path not here: the job's
    algorithms.sft("data.train.path=/on/the/cluster.jsonl", spec=SFT)
    big = tmp_path / "big.jsonl"
    big.write_text(_jsonl([{"question": "q", "answer": "a"}] * 50) + _jsonl([{"text": "t"}]))
    # the first rows only: a later row may hold the columns
    monkeypatch.setattr(local_files, "CLIENT_BYTES", 200)
    algorithms.sft(f"data.train.path={big}", spec=SFT)
    big.write_text('{"text": "a"}\n{"text": \n' + _jsonl([{"text": "t"}] * 50))
    # a bad line in what it read is still said
    with pytest.raises(SpecError, match="line 2 is not valid JSON"):
        algorithms.sft(f"data.train.path={big}", spec=SFT)


def test_a_relative_data_path_that_names_nothing_here_is_refused_before_anything_is_submitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """local_cwd and Slurm jobs run in the client's directory: a typo there is a typo for the job too."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as refused:
        algorithms.sft("data.train.path=data/my_chats.jsonl", "data.eval.path=data/*.jsonl", *EVALUATES, spec=SFT)
    assert refused.value.problems == [
        f"data.train.path: no such file: data/my_chats.jsonl (relative paths start at {tmp_path}); a file only the "
        "job's machines have: give its full path",
        f"data.eval.path: no file matches data/*.jsonl (relative paths start at {tmp_path}); a file only the job's "
        "machines have: give its full path",
    ]


def test_a_model_directory_the_client_can_see_is_checked_in_the_jobs_words(tmp_path: Path) -> None:
    from posttrain.entrypoints.inputs.models import check_model_path

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "checkpoint-20").mkdir()
    (model / "checkpoint-20" / "trainer_state.json").write_text("{}")
    with pytest.raises(SpecError) as client:
        algorithms.sft(f"model.name_or_path={model}", spec=SFT)
    with pytest.raises(SpecError) as job:
        check_model_path(str(model))
    assert (
        client.value.problems
        == job.value.problems
        == [
            f"model.name_or_path: {model} is not a model directory: no weights (*.safetensors or *.bin), no tokenizer files "
            "(tokenizer.json, tokenizer.model, vocab.json, ...); it holds checkpoint-20 (an unfinished run?): name that "
            "directory"
        ]
    )
    with pytest.raises(SpecError, match="teacher_model: .* is a file; expected a model directory"):
        algorithms.distill(f"teacher_model={model / 'config.json'}", spec=str(TEMPLATES / "distill/tiny.yaml"))
    # not here (a hub id, a stage an earlier run of a chain writes): the job's to check
    algorithms.sft("model.name_or_path=outputs/not-written-yet", spec=SFT)
