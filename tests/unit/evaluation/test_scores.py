"""What an evaluation's scores say (entrypoints/evaluation/scores.py): pass@k, means and errors over prompts, the
models against the first, and the closing line, on cases computed by hand; a benchmark task's metrics as the
harness names them (benchmarks.py)."""

import doctest
import math
from typing import Any, Dict, List

import pytest

from posttrain.entrypoints.evaluation import benchmarks, scores


def test_doctests() -> None:
    assert doctest.testmod(scores).failed == 0 and doctest.testmod(benchmarks).failed == 0


def test_benchmark_tasks_follow_the_scorers_in_the_line_and_alone_count_no_prompts() -> None:
    summary = {
        "models": {"base": {}, "sft": {}},
        "comparisons": {"sft": {}},
        "benchmarks": {
            "base": {"answer_form": {"acc": {"value": 0.5, "stderr": 0.06}}, "gsm8k": {}},
            "sft": {"answer_form": {"acc": {"value": 1.0, "stderr": 0.0}}, "gsm8k": {}},
        },
    }
    line = scores.closing_line(summary, ["base", "sft"], [], None, ["answer_form", "gsm8k"])
    # a task without metrics (a group's own entry) says nothing
    assert line == "posttrain: eval of 2 models (base, sft): answer_form acc 0.50 -> 1.00"


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        # by hand: 1 - C(n-c, k) / C(n, k)
        (5, 2, 1, 2 / 5),
        (5, 2, 2, 1 - 3 / 10),
        (5, 2, 3, 1 - 1 / 10),
        (5, 2, 4, 1.0),
        (5, 0, 3, 0.0),
        (10, 3, 5, 1 - 21 / 252),
    ],
)
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int, expected: float) -> None:
    assert scores.pass_at_k(n, c, k) == pytest.approx(expected)


def samples_of(model: str, per_prompt: List[List[float]]) -> List[Dict[str, Any]]:
    return [
        {"model": model, "index": index, "scores": {"right": score}}
        for index, prompt_scores in enumerate(per_prompt)
        for score in prompt_scores
    ]


def test_means_errors_and_differences_are_over_prompts() -> None:
    base = [[0, 0, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0]]
    trained = [[1, 1, 1, 1], [0, 1, 1, 0], [1, 1, 0, 1]]
    summary = scores.summarise(
        samples_of("base", base) + samples_of("trained", trained), ["base", "trained"], ["right"], [1, 2]
    )
    trained_right = summary["models"]["trained"]["right"]
    # prompt means 1, 0.5, 0.75
    assert trained_right["mean"] == pytest.approx(0.75)
    assert trained_right["stderr"] == pytest.approx(0.25 / math.sqrt(3))
    assert trained_right["pass_at_k"]["1"] == pytest.approx(0.75)
    # per prompt: C(4-c, 2) / C(4, 2) fails: 0, 1/6, 0
    assert trained_right["pass_at_k"]["2"] == pytest.approx((1 + 5 / 6 + 1) / 3)
    assert (trained_right["prompts"], trained_right["samples"]) == (3, 12)
    difference = summary["comparisons"]["trained"]["right"]
    # per prompt: 0.75, 0.5, 0.5
    assert difference["mean"] == pytest.approx(0.75 - 1 / 6)
    assert difference["stderr"] == pytest.approx(math.sqrt(1 / 48) / math.sqrt(3))
    line = scores.closing_line(summary, ["base", "trained"], ["right"], 3)
    assert line == "posttrain: eval of 2 models (base, trained) on 3 prompts: right 0.17 -> 0.75 (+0.58 ± 0.08)"


def test_a_score_of_none_is_left_out_and_one_model_is_said_alone() -> None:
    samples = samples_of("only", [[1, None], [0, 0]])
    summary = scores.summarise(samples, ["only"], ["right"], [1, 2])
    right = summary["models"]["only"]["right"]
    assert right["samples"] == 3 and right["mean"] == pytest.approx(0.5)
    # pass@2 only where two samples were scored: the second prompt's
    assert right["pass_at_k"] == {"1": pytest.approx(0.5), "2": 0.0}
    line = scores.closing_line(summary, ["only"], ["right"], 2)
    assert line == "posttrain: eval of only on 2 prompts: right 0.50 (± 0.50)"


def test_pass_at_k_with_fewer_scored_samples_than_k_is_null_not_a_pass() -> None:
    summary = scores.summarise(samples_of("only", [[None, None, 0, 0]]), ["only"], ["right"], [4])
    assert summary["models"]["only"]["right"]["pass_at_k"] == {"4": None}


def test_one_prompt_has_no_standard_error() -> None:
    summary = scores.summarise(samples_of("a", [[1, 0]]) + samples_of("b", [[1, 1]]), ["a", "b"], ["right"], [1])
    assert summary["models"]["a"]["right"]["stderr"] is None
    assert summary["comparisons"]["b"]["right"]["stderr"] is None
    line = scores.closing_line(summary, ["a", "b"], ["right"], 1)
    assert line == "posttrain: eval of 2 models (a, b) on 1 prompt: right 0.50 -> 1.00 (+0.50 ± n/a)"
