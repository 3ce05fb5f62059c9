"""Arithmetic word problems solved by an agent written as a program, with the calculator of
templates/tools/calculator.py (``agent: {function: posttrain.templates.agents.calculator:solve}``).

It offers the model the calculator (its schema from the function's signature and docstring, as TRL writes a tool's),
runs the calls the model makes and gives their results back, for at most two rounds of calls; the episode's reward
is posttrain's ``math_verify`` of the last reply against the row's ``answer``.
"""

import json
from typing import Any, Dict

from transformers.utils import get_json_schema

from posttrain.components.spec.rewards import math_verify
from posttrain.templates.tools.calculator import calculate

CALCULATOR = get_json_schema(calculate)
ROUNDS = 2
score = math_verify("answer")


async def solve(client: Any, model: str, row: Dict[str, Any]) -> Dict[str, Any]:
    messages = list(row["prompt"])
    calls = failed = 0
    for _ in range(ROUNDS + 1):
        reply = (await client.chat.completions.create(model=model, messages=messages, tools=[CALCULATOR])).choices[0]
        messages.append(reply.message.model_dump(exclude_none=True))
        if not reply.message.tool_calls:
            break
        for call in reply.message.tool_calls:
            calls += 1
            try:
                if call.function.name != "calculate":
                    raise ValueError(f"no tool named {call.function.name}; the one tool is calculate")
                result = calculate(**json.loads(call.function.arguments))
            except Exception as error:  # noqa: BLE001 -- the model reads its mistake back, as from TRL's tool loop
                failed += 1
                result = f"error: {error}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    last = messages[-1]
    said = (last.get("content") or "") if last["role"] == "assistant" else ""
    reward = score([[{"role": "assistant", "content": said}]], answer=[row["answer"]])[0]
    return {"reward": reward, "metrics": {"calls": float(calls), "failed_calls": float(failed)}}
