"""Built-in rewards (``rewards: [{builtin: NAME, args: {...}}]``), each scoring in [0, 1].

Plain Python, no torch: the client validates names and arguments against these
signatures at submit time. In the job each becomes a TRL reward function,
``f(prompts, completions, **columns) -> list[float]``; completions are strings
or chat messages, and extra data-set columns arrive as keyword lists.
"""

import functools
import inspect
import re
import typing
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional

from posttrain.components.spec import code_runs, reasoning_tasks

# the spec's own type rules, for argument values too
from posttrain.components.spec.fields import field_type
from posttrain.components.spec.messages import cut

RewardFunction = Callable[..., List[float]]

_LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def completion_text(completion: Any) -> str:
    """What the model wrote: a string, or the content of its own chat messages (tools' results are not its text)."""
    if isinstance(completion, str):
        return completion
    return "".join(message.get("content") or "" for message in completion if message.get("role") != "tool")


def answer_text(completion: Any) -> str:
    """What a completion answers with: a string, or its last message's content (after any tool calls and their
    results)."""
    if isinstance(completion, str):
        return completion
    return (completion[-1].get("content") or "") if completion else ""


def final_answer(text: str, pattern: Optional[str] = None) -> Optional[str]:
    """The final answer in ``text``: the first group of ``pattern``, else the last number.

    >>> final_answer("3 plus 4 is 7.")
    '7'
    >>> final_answer("so the answer is #### 1,024", r"####\\s*(\\S+)")
    '1,024'
    """
    if pattern is not None:
        match = re.search(pattern, text)
        return match.group(1).strip() if match else None
    numbers = _LAST_NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def expected_answer(value: Any, answer_pattern: Optional[str]) -> Optional[str]:
    """The answer a data set's value holds: the first group of ``answer_pattern``, else the whole value."""
    return final_answer(str(value), answer_pattern) if answer_pattern else str(value)


def exact_match(
    column: str = "answer", pattern: Optional[str] = None, answer_pattern: Optional[str] = None
) -> RewardFunction:
    """1 where the completion's final answer equals the one in the data set's ``column``, else 0.

    The completion's answer is the first group of ``pattern``, else its last
    number; the expected one is the first group of ``answer_pattern`` (e.g.
    ``####\\s*(\\S+)`` for GSM8K solutions), else the whole value. Numbers
    compare without thousands separators.
    """

    def score(completions: List[Any], **columns: Any) -> List[float]:
        scores = []
        for completion, expected in zip(completions, columns[column]):
            got = final_answer(completion_text(completion), pattern)
            want = expected_answer(expected, answer_pattern)
            scores.append(float(got is not None and want is not None and _normalise(got) == _normalise(want)))
        return scores

    return score


def _normalise(answer: str) -> str:
    answer = answer.strip()
    return answer.replace(",", "") if _LAST_NUMBER.fullmatch(answer) else answer


def math_verify(column: str = "answer", answer_pattern: Optional[str] = None) -> RewardFunction:
    """1 where the completion's answer equals the row's ``column`` as mathematics, else 0: ``1/2``, ``0.5`` and
    ``\\frac{1}{2}`` are one answer (the math-verify package: LaTeX, boxed and plain answers, compared as
    expressions).

    The expected answer is the first group of ``answer_pattern`` (e.g.
    ``####\\s*(\\S+)`` for GSM8K solutions), else the whole value; the
    completion's is read from its last message (the answer after any tool
    calls). An expected answer math-verify cannot read scores 0.
    """
    # the job's, imported where the reward is made: the client only checks the arguments
    import threading

    from math_verify import parse, verify

    def score(completions: List[Any], **columns: Any) -> List[float]:
        # math-verify's time limits are alarms: the main thread's alone
        limit = 5 if threading.current_thread() is threading.main_thread() else None
        scores = []
        for completion, expected in zip(completions, columns[column]):
            want = expected_answer(expected, answer_pattern)
            gold = parse(want, parsing_timeout=limit) if want is not None else []
            got = parse(answer_text(completion), parsing_timeout=limit)
            scores.append(float(bool(gold) and bool(got) and verify(gold, got, timeout_seconds=limit)))
        return scores

    return score


def code_tests(column: str = "tests", timeout_s: float = 10.0, memory_mb: int = 1024) -> RewardFunction:
    """1 where the completion's code passes the row's tests (``column``, Python source), else 0.

    The code is the last fenced block of the completion's answer (its last
    message), else the whole answer. It runs in one sandboxed process, the
    tests in another, each within ``timeout_s`` seconds and ``memory_mb``
    MiB (``code_runs.py``): the tests call the code's functions across a
    pipe, compare what comes back themselves, and give the verdict, which the
    code cannot reach. Why each failed, and the end of the program's stderr,
    go to TRL's completions table (``log_extra``, column
    ``code_tests/<column>``) where the trainer passes it.
    """
    # said once, where the reward is made: what this machine keeps the programs from
    code_runs.isolation()
    run = functools.partial(code_runs.run, timeout_s=timeout_s, memory_mb=memory_mb)
    workers = code_runs.workers()

    def score(
        completions: List[Any], log_extra: Optional[Callable[[str, List[str]], None]] = None, **columns: Any
    ) -> List[float]:
        codes = [code_runs.code_of(answer_text(completion)) for completion in completions]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            outcomes = list(pool.map(run, codes, columns[column]))
        if log_extra is not None:
            log_extra(f"code_tests/{column}", [outcome.text() for outcome in outcomes])
        return [float(outcome.passed) for outcome in outcomes]

    return score


def contains(
    target: Optional[str] = None, column: Optional[str] = None, case_sensitive: bool = False
) -> RewardFunction:
    """1 where the completion contains ``target`` (or the row's ``column``), else 0."""

    def score(completions: List[Any], **columns: Any) -> List[float]:
        targets = columns[column] if column is not None else [target] * len(completions)
        found = []
        for completion, wanted in zip(completions, targets):
            text, wanted = completion_text(completion), str(wanted)
            if not case_sensitive:
                text, wanted = text.lower(), wanted.lower()
            found.append(float(wanted in text))
        return found

    return score


def length_band(min_chars: int, max_chars: int) -> RewardFunction:
    """1 inside ``[min_chars, max_chars]``; outside, falling linearly to 0 one band-width away.

    The slope gives a policy a direction even before it reaches the band.
    """
    width = max(1, max_chars - min_chars)

    def score(completions: List[Any], **columns: Any) -> List[float]:
        scores = []
        for completion in completions:
            length = len(completion_text(completion))
            distance = max(min_chars - length, length - max_chars, 0)
            scores.append(max(0.0, 1.0 - distance / width))
        return scores

    return score


def regex_format(pattern: str, full: bool = False) -> RewardFunction:
    """1 where the completion matches ``pattern`` (the whole of it with ``full``), else 0."""
    compiled = re.compile(pattern, re.DOTALL)
    match = compiled.fullmatch if full else compiled.search

    def score(completions: List[Any], **columns: Any) -> List[float]:
        return [float(match(completion_text(c).strip()) is not None) for c in completions]

    return score


# how reasoning-gym's prompts ask for the answer (its SYSTEM_PROMPTS["default"])
ANSWER_TAG = r"<answer>(.*?)</answer>"


def reasoning_gym(
    column: str = reasoning_tasks.KEY_COLUMN, pattern: Optional[str] = ANSWER_TAG, strict: bool = False
) -> RewardFunction:
    """The task's own score of the answer, for rows a ``reasoning_gym`` data source generated: reasoning-gym's
    ``score_answer`` (1 right, partial credit where the task gives it, 0 wrong or none) of the row that ``column``
    names (``reasoning_tasks.py``); with ``strict``, 1 where it is 1, else 0 (reasoning-gym's default partial
    credit pays an answer that holds the right one inside it: ``14`` for ``4`` earns 0.5).

    The answer is the first group of the last match of ``pattern`` in the
    completion's answer (its last message): ``<answer>...</answer>``, as
    reasoning-gym's prompts ask; with ``pattern: null``, its last line that
    is not blank. What was read goes to the samples (column
    ``reasoning_gym/answer``; empty where nothing was).
    """
    reasoning_tasks.imported("rewards: builtin reasoning_gym")
    compiled = re.compile(pattern, re.DOTALL) if pattern is not None else None

    def read(completion: Any) -> Optional[str]:
        text = answer_text(completion)
        if compiled is None:
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            return lines[-1] if lines else None
        matches = list(compiled.finditer(text))
        return matches[-1].group(1).strip() if matches else None

    def score(
        completions: List[Any], log_extra: Optional[Callable[[str, List[str]], None]] = None, **columns: Any
    ) -> List[float]:
        answers = [read(completion) for completion in completions]
        if log_extra is not None:
            log_extra("reasoning_gym/answer", [answer or "" for answer in answers])
        scores = [reasoning_tasks.score(answer, key) for answer, key in zip(answers, columns[column])]
        return [float(score == 1.0) for score in scores] if strict else scores

    return score


BUILTIN_REWARDS: Dict[str, Callable[..., RewardFunction]] = {
    "exact_match": exact_match,
    "contains": contains,
    "length_band": length_band,
    "regex_format": regex_format,
    "math_verify": math_verify,
    "code_tests": code_tests,
    "reasoning_gym": reasoning_gym,
}


def check_builtin(name: str, args: Dict[str, Any]) -> List[str]:
    """What is wrong with a built-in reward's name or arguments (for the client)."""
    factory = BUILTIN_REWARDS.get(name)
    if factory is None:
        return [f"unknown built-in reward {name!r}; expected one of {', '.join(BUILTIN_REWARDS)}"]
    signature = inspect.signature(factory)
    try:
        signature.bind(**args)
    except TypeError as error:
        return [f"{name}: {error}; arguments: {signature}"]
    hints = typing.get_type_hints(factory)
    wrong = [(key, field_type(hints[key]).check(value)) for key, value in args.items()]
    if any(problem for _, problem in wrong):
        return [f"{name}.{key}: {problem}" for key, problem in wrong if problem]
    if name == "contains" and (args.get("target") is None) == (args.get("column") is None):
        return ["contains: give exactly one of target or column"]
    if name == "length_band" and not 0 <= args.get("min_chars", 0) <= args.get("max_chars", 0):
        return ["length_band: expected 0 <= min_chars <= max_chars"]
    if name == "code_tests" and (args.get("timeout_s", 10.0) <= 0 or args.get("memory_mb", 1024) < 64):
        return ["code_tests: expected timeout_s > 0 and memory_mb >= 64 (an interpreter needs about that)"]
    for key in ("pattern", "answer_pattern"):
        if args.get(key) is not None:
            try:
                compiled = re.compile(args[key])
            except re.error as error:
                return [f"{name}: {key} is not a valid regular expression: {error}"]
            # the answer is its first group; regex_format's only matches
            if name != "regex_format" and compiled.groups < 1:
                return [f"{name}: {key} {cut(repr(args[key]))} has no group: the answer is its first, (...)"]
    return []


def builtin_reward(name: str, args: Dict[str, Any]) -> RewardFunction:
    """The reward function of a built-in, named for TRL's logs (``rewards/<name>/mean``)."""
    function = BUILTIN_REWARDS[name](**args)
    function.__name__ = name
    return function
