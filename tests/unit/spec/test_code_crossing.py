"""What crosses between a completion's code and its tests (``code_sandbox.crossing.encode``/``decode``: plain data, objects as
handles), which code is taken from an answer, and how many programs a rank runs at once. The processes themselves:
tests/integration/test_code_tests.py."""

import json
import math
from typing import Any

import pytest

from posttrain.components.spec import code_runs
from posttrain.components.spec.code_sandbox import crossing, program_part


def _no_handles(value: Any) -> Any:
    raise TypeError(f"not plain: {value!r}")


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -(10**400),
        1.5,
        math.inf,
        "é\n\udc80",
        b"\x00\xff",
        1 + 2j,
        [1, [2.0, None]],
        (1, ("a", b"b")),
        {1, (2, 3)},
        frozenset({"x"}),
        {(1, 2): {"k": [True]}, None: set()},
    ],
)
def test_plain_data_crosses_as_it_was(value: Any) -> None:
    line = json.dumps(crossing.encode(value, _no_handles))
    crossed = crossing.decode(json.loads(line), _no_handles)
    assert crossed == value and type(crossed) is type(value)


def test_nan_crosses_and_any_other_object_is_a_handle_either_way() -> None:
    [crossed] = crossing.decode(crossing.encode([math.nan], _no_handles), _no_handles)
    assert math.isnan(crossed)
    held = []
    encoded = crossing.encode([object(), 1], lambda value: held.append(value) or {"handle": len(held) - 1})
    assert encoded == [{"handle": 0}, 1]
    assert crossing.decode(encoded, lambda number: f"handle {number}") == ["handle 0", 1]


@pytest.mark.parametrize(
    "data",
    [{"pickle": "x"}, {"tuple": 1}, {"dict": [[1]]}, {"complex": ["1", "2"]}, {"handle": "0"}, {"a": 1, "b": 2}],
)
def test_anything_but_plain_data_and_handles_is_refused(data: Any) -> None:
    with pytest.raises(ValueError):
        crossing.decode(data, _no_handles)


def test_a_subclass_of_a_plain_type_is_a_handle_whose_plain_data_is_its_base_types() -> None:
    class Row(list):
        def __eq__(self, other: object) -> bool:
            return True

    assert crossing.encode(Row([1]), lambda value: "handle") == "handle"
    plain = program_part.plain(Row([1, Row([2])]))
    assert plain == [1, [2]] and type(plain[1]) is list
    with pytest.raises(TypeError):
        program_part.plain(object())


def test_the_code_is_the_last_fenced_block_else_the_whole_answer() -> None:
    assert code_runs.code_of("a\n```python\nx = 1\n```\nb\n```\ny = 2\n```\n") == "y = 2"
    assert code_runs.code_of("x = 1") == "x = 1"


def test_each_rank_runs_its_share_of_the_cpus_it_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(code_runs.os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert code_runs.workers() == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert code_runs.workers() == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert code_runs.workers() == 1
