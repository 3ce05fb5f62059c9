"""Data mixtures: ``data.train`` (and ``data.eval``) as a list of sources (files, globs, saved or hub data sets),
each with its own renames and cap on rows, concatenated or interleaved by weight, checked source by source."""

import json
from pathlib import Path
from typing import Any

import pytest

from helpers import CHAT, _pc, _qa, _write, load_template
from posttrain.components import algorithms
from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.registry import SPEC_CLASSES
from posttrain.entrypoints.inputs.data import load_split
from posttrain.entrypoints.records.fingerprints import split_fingerprint

SFT = "templates/sft/tiny.yaml"


SFT_FORMATS = SPEC_CLASSES["sft"].data_formats


def _spec(train: Any, **data: Any) -> Any:
    raw = load_template("sft/tiny.yaml")
    raw["data"] = {"train": train, **data}
    return validate(raw)


@pytest.mark.parametrize(
    "train, data, message",
    [
        ([], {}, "data.train: an empty list; give one source, or a list of several to mix"),
        (
            [{"path": str(CHAT)}, {"path": str(CHAT), "weight": 2}],
            {},
            "data.train.1.weight: weights choose how often an interleaved mixture draws from each source; set data.mix",
        ),
        (
            [{"path": str(CHAT)}, {"path": str(CHAT), "weight": 2}],
            {"mix": "interleave"},
            "data.train: data.train.1 have a weight and the other sources none; give every source a weight, or none",
        ),
        (
            [{"path": str(CHAT), "max_rows": 0}, {"path": str(CHAT)}],
            {},
            "data.train.0.max_rows: 0; expected at least 1",
        ),
        ({"path": str(CHAT)}, {"mix": "interleave"}, "data.mix: interleave draws from several sources"),
        ([{"path": str(CHAT)}, {"name": "org/data", "path": str(CHAT)}], {}, "data.train.1: give exactly one of path"),
        (
            [{"path": str(CHAT)}, {"path": str(CHAT), "columns": {"a": "prompt", "b": "prompt"}}],
            {},
            "data.train.1.columns: a, b are all renamed to prompt",
        ),
    ],
)
def test_a_mixture_that_does_not_hold_together_is_one_line_naming_the_source(
    train: Any, data: dict, message: str
) -> None:
    with pytest.raises(SpecError) as error:
        _spec(train, **data)
    assert len(error.value.problems) == 1 and error.value.problems[0].startswith(message), error.value.problems


def test_sources_are_renamed_capped_and_concatenated_in_order(tmp_path: Path) -> None:
    qa, pc = _qa(tmp_path), _pc(tmp_path)
    spec = _spec(
        [
            {"path": pc, "max_rows": 10},
            {"path": qa, "columns": {"question": "prompt", "answer": "completion"}, "max_rows": 5},
        ]
    )
    mixed = load_split(spec.data, SFT_FORMATS, "train", seed=0)
    assert len(mixed) == 15 and mixed.column_names == ["prompt", "completion"]
    pairs = [json.loads(line) for line in Path(pc).read_text().splitlines()]
    assert mixed[:10] == {
        "prompt": [p["prompt"] for p in pairs[:10]],
        "completion": [p["completion"] for p in pairs[:10]],
    }
    # the second source's first row follows the first's tenth
    assert mixed[10]["prompt"] == pairs[0]["prompt"]
    # chat messages and prompt/completion pairs: nothing to train on in both
    with pytest.raises(SpecError) as error:
        load_split(_spec([{"path": str(CHAT)}, {"path": pc}]).data, SFT_FORMATS, "train", seed=0)
    assert error.value.problems[0].startswith("data.train: its sources share none of the column sets (messages) or")


def test_a_mixture_keeps_the_columns_every_source_has_and_checks_each_source(tmp_path: Path) -> None:
    qa = _qa(tmp_path)
    a = _write(tmp_path / "a.jsonl", [{"prompt": "p", "completion": "c", "source": "a"}] * 4)
    spec = _spec([{"path": a}, {"path": qa, "columns": {"question": "prompt", "answer": "completion"}}])
    mixed = load_split(spec.data, SFT_FORMATS, "train", seed=0)
    assert mixed.column_names == ["prompt", "completion"] and len(mixed) == 4 + len(CHAT.read_text().splitlines())
    bad = _write(tmp_path / "bad.jsonl", [{"question": "q"}])
    with pytest.raises(SpecError) as error:
        load_split(_spec([{"path": a}, {"path": bad}]).data, SFT_FORMATS, "train", seed=0)
    assert error.value.problems[0].startswith("data.train.1: found columns ['question']; expected")


def test_interleaving_draws_by_weight_with_the_seed_until_every_source_is_used(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.jsonl", [{"text": f"a{i}"} for i in range(30)])
    b = _write(tmp_path / "b.jsonl", [{"text": f"b{i}"} for i in range(10)])
    spec = _spec([{"path": a, "weight": 3}, {"path": b, "weight": 1}], mix="interleave")
    mixed = load_split(spec.data, SFT_FORMATS, "train", seed=0)
    texts = mixed["text"]
    # every row drawn at least once
    assert set(texts) >= {f"a{i}" for i in range(30)} | {f"b{i}" for i in range(10)}
    assert (
        texts
        == load_split(spec.data, SFT_FORMATS, "train", seed=0)["text"]
        != load_split(spec.data, SFT_FORMATS, "train", seed=1)["text"]
    )
    first = texts[:40]
    # 3 to 1
    assert sum(t.startswith("a") for t in first) > 2 * sum(t.startswith("b") for t in first)


def test_a_glob_reads_every_file_it_matches_and_names_a_bad_one(tmp_path: Path) -> None:
    for part in range(3):
        _write(tmp_path / f"part-{part}.jsonl", [{"text": f"{part}-{i}"} for i in range(5)])
    spec = _spec({"path": str(tmp_path / "part-*.jsonl")})
    assert sorted(load_split(spec.data, SFT_FORMATS, "train", seed=0)["text"]) == sorted(
        f"{p}-{i}" for p in range(3) for i in range(5)
    )
    (tmp_path / "part-1.jsonl").write_text('{"text": "x"}\n{"text": \n')
    with pytest.raises(SpecError) as job:
        load_split(spec.data, SFT_FORMATS, "train", seed=0)
    assert job.value.problems == [
        f"data.train.path: {tmp_path / 'part-1.jsonl'} line 2 is not valid JSON (Expecting value, column 10)"
    ]
    # the client, which sees the files, says it before submitting
    with pytest.raises(SpecError) as client:
        algorithms.sft(f"data.train.path={tmp_path / 'part-*.jsonl'}", spec=SFT)
    assert client.value.problems == job.value.problems
    with pytest.raises(SpecError, match=r"data.train.path: no file matches .*nothing-\*.jsonl"):
        load_split(_spec({"path": str(tmp_path / "nothing-*.jsonl")}).data, SFT_FORMATS, "train", seed=0)


def test_the_client_names_the_source_of_a_mixture_it_can_read(tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.jsonl", [{"question": "q"}])
    with pytest.raises(SpecError) as error:
        algorithms.sft(f"data.train=[{{path: {CHAT}}}, {{path: {bad}}}]", spec=SFT)
    assert error.value.problems[0].startswith("data.train.1: found columns ['question']; expected")


def test_a_resume_knows_a_mixture_changed(tmp_path: Path) -> None:
    spec = _spec([{"path": str(CHAT), "weight": 1}, {"path": str(CHAT), "weight": 1}], mix="interleave")
    reweighted = _spec([{"path": str(CHAT), "weight": 1}, {"path": str(CHAT), "weight": 3}], mix="interleave")
    inputs = [split_fingerprint(s.data, "train", None) for s in (spec, reweighted)]
    assert inputs[0] != inputs[1] and inputs[0]["mix"] == "interleave"
    capped = [split_fingerprint(_spec({"path": str(CHAT), **cap}).data, "train", None) for cap in ({}, {"max_rows": 9})]
    assert capped[0] != capped[1]
