"""Rewards in the job: a reward module that fails to import, a column a built-in lacks, and every score checked.

A bad score (NaN, infinite, not a number, a wrong count) is replaced for the
step and stops every rank at the step's end with the reward's name; async
rewards stay async, as TRL awaits them.
"""

import asyncio
import inspect
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from trl.trainer.utils import is_async_callable

from helpers import load_template
from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.inputs.data import load_data
from posttrain.entrypoints.inputs.rewards import RewardCheck, check_reward_columns, resolve_rewards


def grpo_spec(**changes: object):
    return validate({**load_template("grpo/tiny.yaml"), **changes})


def test_any_error_importing_a_reward_module_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bad_rewards.py").write_text("raise ValueError('no API key in the environment\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SpecError) as error:
        resolve_rewards(grpo_spec(rewards=[{"function": "bad_rewards:score"}]).rewards)
    assert str(error.value) == (
        "rewards.0.function: importing bad_rewards raised ValueError: no API key in the environment"
    )


def test_a_builtin_reading_a_column_the_data_lacks(tmp_path: Path) -> None:
    spec = grpo_spec(rewards=[{"builtin": "contains", "args": {"target": "x"}}, {"builtin": "exact_match"}])
    prompts = load_data(spec.data.train, {}, "data.train", spec.data_formats)
    with pytest.raises(SpecError) as error:
        check_reward_columns(spec.rewards, spec.keeps_only_prompts, [("data.train", prompts)])
    assert str(error.value) == (
        "rewards.1: exact_match reads column 'answer', which data.train lacks; found ['prompt'] "
        "(set args.column, or map names with data.columns)"
    )


def scores_of(values: list):
    def my_score(prompts: list, completions: list, **columns: object) -> list:
        return values

    return my_score


@pytest.mark.parametrize(
    "values, problem, safe",
    [
        ([1.0, math.nan], "returned nan", [1.0, 0.0]),
        ([float("inf"), 0.0], "returned inf", [0.0, 0.0]),
        ([1.0], "returned 1 scores for 2 completions; expected one per completion", [0.0, 0.0]),
        (0.5, "returned float; expected a list of one float (or None) per completion", [0.0, 0.0]),
        ([1.0, "high"], "returned 'high' (str) for completion 1; expected a float or None", [1.0, 0.0]),
    ],
)
def test_reward_scores_are_checked_and_stop_at_the_steps_end(values: object, problem: str, safe: list) -> None:
    check = RewardCheck()
    wrapped = check.wrap(scores_of(values), "rewards.0")
    # TRL logs rewards/my_score/mean
    assert wrapped.__name__ == "my_score"
    # the step goes on with zeros in place of the bad scores (no NaN loss, no crash inside the trainer)
    assert wrapped(prompts=["p", "q"], completions=["a", "b"], completion_ids=[[1], [2]]) == safe
    with pytest.raises(SpecError) as error:
        check.on_step_end(None, SimpleNamespace(global_step=12), None)
    assert str(error.value) == f"rewards.0 (my_score): {problem} at step 12"
    # no trainer: at once
    with pytest.raises(SpecError, match=f"^rewards.0 \\(my_score\\): {problem[:10]}"):
        RewardCheck(stop_at_step_end=False).wrap(scores_of(values), "rewards.0")(prompts=[], completions=["a", "b"])


def test_good_scores_pass_untouched_and_async_functions_stay_async() -> None:
    check = RewardCheck()
    assert check.wrap(scores_of([1.0, None]), "rewards.0")(prompts=["p", "q"], completions=["a", "b"]) == [1.0, None]
    check.on_step_end(None, SimpleNamespace(global_step=1), None)

    async def judged(completions: list, **columns: object) -> list:
        return [math.nan] * len(completions)

    wrapped = check.wrap(judged, "rewards.1")
    assert inspect.iscoroutinefunction(wrapped) and wrapped.__name__ == "judged"

    # an object with an async __call__: TRL awaits it too
    class Judge:
        async def __call__(self, completions: list, **columns: object) -> list:
            return [0.5] * len(completions)

    wrapped = check.wrap(Judge(), "rewards.2")
    assert is_async_callable(wrapped) and wrapped.__name__ == "Judge"
    assert asyncio.run(wrapped(prompts=["p"], completions=["a"])) == [0.5]
    # nothing recorded against it
    check.on_step_end(None, SimpleNamespace(global_step=2), None)
