"""The rooms of templates/tools/hidden_value.py played by an agent written as a program, the way agents are written
against an OpenAI-compatible server (``agent: {function: posttrain.templates.agents.rooms:solve}``).

It offers the model one tool, ``peek``, described as the model was trained to see it; runs the calls the model
makes, gives their results back and asks again, for at most two rounds of calls; the episode's reward is 1 where
the model's last reply is the hidden value.
"""

from typing import Any, Dict

# peek as the tools SFT and GRPO models were trained to see it: transformers' schema of Room.peek
PEEK = {
    "type": "function",
    "function": {
        "name": "peek",
        "description": "The value hidden in this room.",
        "parameters": {"type": "object", "properties": {}},
        "return": {"type": "string"},
    },
}
ROUNDS = 2


async def solve(client: Any, model: str, row: Dict[str, Any]) -> Dict[str, Any]:
    messages = list(row["prompt"])
    calls = 0
    for _ in range(ROUNDS + 1):
        reply = (await client.chat.completions.create(model=model, messages=messages, tools=[PEEK])).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            calls += 1
            found = call.function.name == "peek"
            result = str(row["answer"]) if found else f"no tool named {call.function.name}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    said = (messages[-1].get("content") or "").strip() if messages[-1]["role"] == "assistant" else ""
    return {"reward": float(said == str(row["answer"])), "metrics": {"peeked": float(calls > 0)}}
