"""A tiny verifiers 0.4.0 taskset (``verifiers.v1``), single-turn: "Say 7." and the model's reply must hold 7.

Its tasks are the digits, ``num_tasks`` of them in turn; its one reward, ``said``, is 1 where the last reply
holds the task's digit. Small enough for a tiny model to learn on CPU, by GRPO after an SFT warm start
(templates/chain/verifiers-tiny.yaml).
"""

import verifiers.v1 as vf


class Digit(vf.TaskData):
    digit: str


class SayDigit(vf.Task[Digit]):
    @vf.reward(weight=1.0)
    async def said(self, trace: vf.Trace) -> float:
        replies = trace.assistant_messages
        return float(bool(replies) and self.data.digit in (replies[-1].content or ""))


class SayDigitConfig(vf.TasksetConfig):
    num_tasks: int = 40


class SayDigitTaskset(vf.Taskset[SayDigit, SayDigitConfig]):
    def load(self):
        for index in range(self.config.num_tasks):
            digit = str(index % 10)
            yield SayDigit(Digit(prompt=f"Say {digit}.", digit=digit), self.config.task)


__all__ = ["SayDigitTaskset"]
