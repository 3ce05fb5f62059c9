"""A verifiers 0.4.0 environment's episodes as the job plays them (generation/verifiers_episodes.py): verifiers' own
null harness, in a process per episode, calls the job's endpoint; the reward is the taskset's own, and what trains is
the tokens the endpoint recorded, a tool task's calls one sequence. The tasksets are written here as the docs say
(docs: Agents, "verifiers environments"), in a module of the working directory."""

import json
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, List, Sequence

import pytest

from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.sections import VerifiersEnvironment, VerifiersTaskset
from posttrain.entrypoints.generation import agents
from posttrain.entrypoints.generation.agent_rollouts import sample
from posttrain.entrypoints.generation.endpoint import Endpoint
from posttrain.entrypoints.generation.engine import Completion, Request
from posttrain.entrypoints.inputs.verifiers_tasks import KEY_COLUMN, load_environment, taskset_rows

TASKSETS = '''
    import verifiers.v1 as vf


    class Sum(vf.TaskData):
        answer: str


    class Adder(vf.Toolset[vf.ToolsetConfig]):
        TOOL_PREFIX = "calc"

        @vf.tool
        def add(self, a: int, b: int) -> int:
            """Add two integers."""
            return a + b


    class SumTask(vf.Task[Sum]):
        @classmethod
        def toolsets(cls, config):
            return [Adder(vf.ToolsetConfig())]

        @vf.reward(weight=1.0)
        async def correct(self, trace: vf.Trace) -> float:
            replies = trace.assistant_messages
            return float(bool(replies) and self.data.answer in (replies[-1].content or ""))

        @vf.reward(weight=0.0)
        async def unfinished(self, trace: vf.Trace) -> float:
            if self.data.answer == "5":
                raise ValueError("this task's reward fails")
            return 0.0


    class SumsConfig(vf.TasksetConfig):
        num_tasks: int = 2


    class Sums(vf.Taskset[SumTask, SumsConfig]):
        def load(self):
            for n in range(self.config.num_tasks):
                yield SumTask(Sum(prompt=f"What is 1 + {n + 3}? Use the tool.", answer=str(n + 4)), self.config.task)


    __all__ = ["Sums"]

    if __name__ == "__main__":
        Adder.run()
'''
CALL = '<tool_call>\n{"name": "calc_add", "arguments": {"a": 1, "b": 3}}\n</tool_call><|im_end|>'


class Scripted:
    """An engine whose every completion is ``say(its prompt's text)``."""

    def __init__(self, tokenizer: Any, say: Callable[[str], str]) -> None:
        self.tokenizer, self.say = tokenizer, say

    def __call__(self, requests: Sequence[Request]) -> List[Completion]:
        written = []
        for request in requests:
            said = self.say(self.tokenizer.decode(request.prompt_ids))
            ids = self.tokenizer.encode(said, add_special_tokens=False)[: request.max_tokens]
            written.append(Completion(ids, [-0.5] * len(ids), "stop"))
        return written


def add_then_say(text: str) -> str:
    """calc_add(1, 3) where no result has come back yet, else the result's number."""
    return "It is 4.<|im_end|>" if "<tool_response>" in text else CALL


@pytest.fixture
def sums(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The taskset module ``sums``, in the working directory, which the job imports it from (on its path, as
    ``python -m`` puts it there; not on PYTHONPATH, which the tools' server would read)."""
    (tmp_path / "sums.py").write_text(textwrap.dedent(TASKSETS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.chdir(tmp_path)
    yield "sums"
    sys.modules.pop("sums", None)


def test_a_tool_task_plays_through_the_endpoint_scored_by_its_taskset_and_trains_as_one_sequence(
    sums: str, tools_tokenizer: Any
) -> None:
    environment = VerifiersEnvironment(verifiers=sums, args={"num_tasks": 2}, timeout_s=120)
    rows = taskset_rows(environment.taskset(), "data.train.verifiers").to_list()
    assert rows == [
        {"prompt": [{"role": "user", "content": "What is 1 + 3? Use the tool."}], KEY_COLUMN: 0},
        {"prompt": [{"role": "user", "content": "What is 1 + 4? Use the tool."}], KEY_COLUMN: 1},
    ]
    # the rows and the episodes are one load's tasks
    assert load_environment(environment.taskset(), "here") is load_environment(environment.taskset(), "there")
    endpoint = Endpoint(
        Scripted(tools_tokenizer, add_then_say), tools_tokenizer, None, "policy", 1024, [tools_tokenizer.eos_token_id]
    )
    with endpoint.serving():
        [[right], [failed]] = agents.play(endpoint, agents.resolve(environment), "policy", rows, 1)

    # 1 + 3: the tool's result said back, as the taskset's reward checks
    assert (right.reward, right.error, right.metrics) == (1.0, None, {"correct": 1.0, "unfinished": 0.0})
    first, second = endpoint.calls(right.name)
    assert tools_tokenizer.decode(first.completion_ids) == CALL
    between = second.prompt_ids[len(first.prompt_ids) + len(first.completion_ids) :]
    assert "<tool_response>\n4\n</tool_response>" in tools_tokenizer.decode(between)
    trained = sample([first, second])
    assert trained.prompt_ids == first.prompt_ids
    assert trained.completion_ids == first.completion_ids + between + second.completion_ids
    assert trained.env_mask == [1] * len(first.completion_ids) + [0] * len(between) + [1] * len(second.completion_ids)
    assert trained.logprobs == first.logprobs + [0.0] * len(between) + second.logprobs
    # 1 + 4: its reward raised; the episode scores 0 with why, as an agent program's that raises
    assert failed.reward == 0.0
    assert "this task's reward fails" in failed.error


def test_a_taskset_verifiers_cannot_load_is_one_line_naming_the_key(sums: str) -> None:
    with pytest.raises(SpecError) as raised:
        taskset_rows(VerifiersTaskset(id="no_such_taskset"), "data.train.verifiers")
    [line] = raised.value.problems
    assert line.startswith("data.train.verifiers: verifiers cannot load the taskset 'no_such_taskset' with args {}: ")
    with pytest.raises(SpecError) as raised:
        taskset_rows(VerifiersTaskset(id=sums, args={"num_taskz": 2}), "data.train.verifiers")
    [line] = raised.value.problems
    assert "num_taskz" in line


def solve_word_problem(text: str) -> str:
    """The calculator called on a word problem's numbers (templates/data/word_problems.jsonl: ``a`` crates of ``b``
    each, ``c`` sold) where no result has come back yet, else the result, or 1 more for the second problem."""
    result = re.search(r"<tool_response>\n(\d+)\n</tool_response>", text)
    if result:
        return f"{int(result.group(1)) + ('71 crates' in text)}<|im_end|>"
    a, b, c = re.search(r"receives (\d+) crates with (\d+) \w+ in each, and sells (\d+)", text).groups()
    call = {"name": "calculate", "arguments": {"expression": f"{a} * {b} - {c}"}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>"


def test_the_word_problems_taskset_plays_its_calculator_and_scores_the_answer(tools_tokenizer: Any) -> None:
    """templates/tasksets/word_problems.py, as its GPU template names it (a module path of the installed package):
    the calculator's result said back scores 1 by math_verify, another number 0."""
    environment = VerifiersEnvironment(
        verifiers="posttrain.templates.tasksets.word_problems", args={"num_tasks": 2}, timeout_s=120
    )
    rows = taskset_rows(environment.taskset(), "data.train.verifiers").to_list()
    assert [row["prompt"][0]["content"][:40] for row in rows] == [
        "A shop receives 57 crates with 47 boxes ",
        "A shop receives 71 crates with 21 apples",
    ]
    endpoint = Endpoint(
        Scripted(tools_tokenizer, solve_word_problem),
        tools_tokenizer,
        None,
        "policy",
        1024,
        [tools_tokenizer.eos_token_id],
    )
    with endpoint.serving():
        [[right], [wrong]] = agents.play(endpoint, agents.resolve(environment), "policy", rows, 1)
    assert (right.reward, right.error, right.metrics) == (1.0, None, {"correct": 1.0})
    assert "<tool_response>\n2398\n</tool_response>" in tools_tokenizer.decode(endpoint.calls(right.name)[1].prompt_ids)
    assert (wrong.reward, wrong.error, wrong.metrics) == (0.0, None, {"correct": 0.0})
