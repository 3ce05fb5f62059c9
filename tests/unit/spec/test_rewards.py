"""Built-in rewards: each scores in [0, 1] on text and chat completions."""

import doctest

import pytest

from posttrain.components.spec import rewards
from posttrain.components.spec.rewards import BUILTIN_REWARDS, builtin_reward

CHAT = [[{"role": "assistant", "content": "The sky is blue."}], [{"role": "assistant", "content": "No."}]]


def test_rewards_doctests() -> None:
    assert doctest.testmod(rewards).failed == 0


def test_exact_match_compares_the_final_answer_with_a_column() -> None:
    score = builtin_reward("exact_match", {})
    assert score(["so 3 plus 4 is 7.", "it is 8", "no idea"], answer=["7", "7", "7"]) == [1.0, 0.0, 0.0]
    hashes = builtin_reward("exact_match", {"column": "solution", "pattern": r"####\s*(\S+)"})
    assert hashes(["work... #### 1,024", "#### 12"], solution=["1024", "13"]) == [1.0, 0.0]
    gsm8k = builtin_reward("exact_match", {"answer_pattern": r"####\s*(\S+)"})
    assert gsm8k(["18 - 2 = 16, so 16 eggs", "I think 15"], answer=["...so 16 #### 16", "#### 16"]) == [1.0, 0.0]


def test_contains_a_target_or_a_column() -> None:
    assert builtin_reward("contains", {"target": "BLUE"})(CHAT) == [1.0, 0.0]
    assert builtin_reward("contains", {"target": "BLUE", "case_sensitive": True})(CHAT) == [0.0, 0.0]
    assert builtin_reward("contains", {"column": "word"})(["red apple", "a pear"], word=["apple", "plum"]) == [1.0, 0.0]


def test_length_band_is_one_inside_and_slopes_outside() -> None:
    score = builtin_reward("length_band", {"min_chars": 10, "max_chars": 20})
    assert score(["x" * 15, "x" * 10, "x" * 20, "x" * 5, "x" * 30, "x" * 40]) == [1.0, 1.0, 1.0, 0.5, 0.0, 0.0]


def test_regex_format() -> None:
    score = builtin_reward("regex_format", {"pattern": r"^The \w+ is \w+\.$", "full": True})
    assert score(CHAT) == [1.0, 0.0]


def test_math_verify_compares_answers_as_mathematics() -> None:
    score = builtin_reward("math_verify", {})
    half = ["1/2", "0.5", "\\frac{1}{2}"]
    for expected in half:
        assert score([*half, "\\boxed{\\frac{1}{2}}", "so it is 3", ""], answer=[expected] * 6) == [1, 1, 1, 1, 0, 0]

    # the answer after a tool's result; an expected answer from a solution
    called = [{"role": "assistant", "content": "", "tool_calls": []}, {"role": "tool", "content": "7"}]
    gsm8k = builtin_reward("math_verify", {"answer_pattern": r"####\s*(\S+)"})
    assert gsm8k([called + [{"role": "assistant", "content": "It is 16."}], called], answer=["#### 16"] * 2) == [1, 0]
    assert score(["1/2"], answer=["not an answer"]) == [0.0]


def test_text_rewards_read_what_the_model_wrote_not_what_its_tools_returned() -> None:
    called = [{"role": "assistant", "content": "", "tool_calls": []}, {"role": "tool", "content": "7"}]
    # no answer after the tool's 7, or an answer after it: neither is the tool's text run into the model's
    assert builtin_reward("exact_match", {})(
        [called, called + [{"role": "assistant", "content": "3"}]], answer=["7", "3"]
    ) == [0, 1]
    assert builtin_reward("contains", {"target": "7"})([called]) == [0.0]
    band = builtin_reward("length_band", {"min_chars": 1, "max_chars": 5})
    assert band([called]) == band([""])


# code_tests runs processes: tests/integration/test_code_tests.py; reasoning_gym scores generated rows:
# tests/unit/inputs/test_reasoning_tasks.py
@pytest.mark.parametrize("name", sorted(set(BUILTIN_REWARDS) - {"code_tests", "reasoning_gym"}))
def test_every_builtin_scores_in_the_unit_interval_and_is_named(name: str) -> None:
    args = {
        "exact_match": {},
        "contains": {"target": "a"},
        "length_band": {"min_chars": 1, "max_chars": 4},
        "regex_format": {"pattern": "a+"},
        "math_verify": {},
    }[name]
    function = builtin_reward(name, args)
    scores = function(["a", "bbbbbbbbbb", "", "aaaa 12"], answer=["1", "2", "3", "12"])
    assert all(0.0 <= s <= 1.0 for s in scores) and function.__name__ == name
