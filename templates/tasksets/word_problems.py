"""Arithmetic word problems as a verifiers 0.4.0 taskset (``verifiers.v1``), a tool task: the calculator of
templates/tools/calculator.py offered as a toolset, the last reply scored by posttrain's ``math_verify`` against
the problem's answer.

Its tasks are the problems of templates/data/word_problems.jsonl, the first ``num_tasks`` of them; its one reward,
``correct``. templates/grpo/qwen2.5-0.5b-verifiers-calculator.yaml trains Qwen2.5-0.5B-Instruct in it on GPUs (the
verifiers form of templates/grpo/qwen2.5-0.5b-agent-calculator.yaml).
"""

import itertools
import json
from pathlib import Path

import verifiers.v1 as vf

from posttrain.components.spec.rewards import math_verify
from posttrain.templates.tools.calculator import calculate

PROBLEMS = Path(__file__).parents[1] / "data" / "word_problems.jsonl"
score = math_verify("answer")


class Problem(vf.TaskData):
    answer: str


class Calculator(vf.Toolset[vf.ToolsetConfig]):
    # the tool's own name, as the model sees it in the other calculator templates
    TOOL_PREFIX = None

    @vf.tool
    def calculate(self, expression: str) -> str:
        """Evaluates an arithmetic expression: numbers, + - * / and parentheses.

        Args:
            expression: The expression to evaluate, e.g. "12 * (3 + 4) - 5 / 2".
        """
        return calculate(expression)


class WordProblem(vf.Task[Problem]):
    @classmethod
    def toolsets(cls, config):
        return [Calculator(vf.ToolsetConfig())]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        replies = trace.assistant_messages
        if not replies:
            return 0.0
        last = [{"role": "assistant", "content": replies[-1].content or ""}]
        return score([last], answer=[self.data.answer])[0]


class WordProblemsConfig(vf.TasksetConfig):
    num_tasks: int = 1000


class WordProblems(vf.Taskset[WordProblem, WordProblemsConfig]):
    def load(self):
        with PROBLEMS.open() as lines:
            for line in itertools.islice(lines, self.config.num_tasks):
                row = json.loads(line)
                yield WordProblem(Problem(prompt=row["prompt"][-1]["content"], answer=row["answer"]), self.config.task)


__all__ = ["WordProblems"]

if __name__ == "__main__":
    Calculator.run()
