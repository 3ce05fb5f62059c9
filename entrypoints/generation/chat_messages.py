"""Chat messages as the endpoint (``endpoint.py``) renders them: OpenAI's messages as chat templates take them
(:func:`template_messages`), and the prompt of a call that goes on with an episode's earlier call (:func:`continued`).

A call that goes on with an earlier one is prompted with the earlier
call's prompt and completion, token for token, then the tokens of the
messages added since (a tool's result, the user's next turn), as TRL's tool
loop extends a rollout (``GRPOTrainer._get_tool_suffix_ids``). Rendering the
whole conversation again would tokenize the model's reply from its text,
which does not always give back the tokens sampled (a call's arguments
written with other spacing, a word split otherwise): the model would be
trained on a context it never saw. Kept as sampled, each call of such an
episode extends the one before, and the episode trains as one sequence
(``agent_rollouts.py``).
"""

import json
from typing import Any, Dict, List, Optional, Sequence


class BadRequest(ValueError):
    """A request the endpoint refuses, with the status it answers."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def rendered(
    tokenizer: Any, template: Optional[str], tools: Optional[List[Any]], messages: List[Dict[str, Any]], **options: Any
) -> List[int]:
    """``messages`` (and ``tools``' schemas) through the chat template, as tokens."""
    return list(
        tokenizer.apply_chat_template(
            messages, tools=tools, chat_template=template, tokenize=True, return_dict=True, **options
        )["input_ids"]
    )


def continued(
    tokenizer: Any,
    template: Optional[str],
    tools: Optional[List[Any]],
    held: List[Dict[str, Any]],
    earlier: List[int],
    end_tokens: Sequence[int],
    messages: List[Dict[str, Any]],
    options: Optional[Dict[str, Any]] = None,
) -> Optional[List[int]]:
    """The prompt of ``messages``, which start with ``held`` (an earlier call's conversation and reply), going on
    from ``earlier`` (that call's prompt and completion): where the model did not end its turn with one of
    ``end_tokens`` (cut at its length or a stop string), the template's own end of the turn follows it. None where
    the template does not close the reply's turn with one of them, or renders ``held`` otherwise within
    ``messages``. ``options``: the template's own variables (a request's ``chat_template_kwargs``)."""
    options = options or {}
    before = rendered(tokenizer, template, tools, held, add_generation_prompt=False, **options)
    after = rendered(tokenizer, template, tools, messages, add_generation_prompt=True, **options)
    # the turn as the template closes it, up to its end token: what follows (a newline, the next turn) is new;
    # an end token before the reply's turn opened would take the reply in again
    opened = len(rendered(tokenizer, template, tools, held[:-1], add_generation_prompt=True, **options))
    ends = [index for index, token in enumerate(before) if token in end_tokens and index >= opened]
    if not ends or after[: ends[-1] + 1] != before[: ends[-1] + 1]:
        return None
    closed = [] if earlier[-1] in end_tokens else [before[ends[-1]]]
    return earlier + closed + after[ends[-1] + 1 :]


def template_messages(messages: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """OpenAI's messages as chat templates take them: text parts joined, a call's arguments parsed from their JSON,
    a tool result named by the call it answers."""
    names: Dict[str, str] = {}
    taken = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if part.get("type") == "text")
        turn: Dict[str, Any] = {"role": message.get("role"), "content": content or ""}
        calls = []
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            arguments = function.get("arguments") or {}
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments or "{}")
                except json.JSONDecodeError as error:
                    raise BadRequest(f"tool_calls: the arguments of {function.get('name')} are not JSON: {error}")
            names[call.get("id", "")] = function.get("name", "")
            calls.append({"type": "function", "function": {"name": function.get("name"), "arguments": arguments}})
        if calls:
            turn["tool_calls"] = calls
        if turn["role"] == "tool":
            turn["name"] = message.get("name") or names.get(message.get("tool_call_id", ""), "")
        taken.append(turn)
    return taken
