"""An evaluation's episodes played by an agent program (generation/agents.py), kept as evaluations keep episodes.

An episode whose program raises, returns no reward or runs past
``agent.timeout_s`` scores 0 and is counted (``episodes.errors``), its error
kept in its sample. The transcript an episode keeps is its last chat call's
conversation and reply.
"""

from typing import Any, Dict, List, Sequence

from posttrain.entrypoints.evaluation.episodes import Episode
from posttrain.entrypoints.generation import agents
from posttrain.entrypoints.generation.agents import Outcome, Program
from posttrain.entrypoints.generation.endpoint import Endpoint


def play(
    endpoint: Endpoint, program: Program, model: str, rows: Sequence[Dict[str, Any]], num_samples: int
) -> List[List[Episode]]:
    """Each row's ``num_samples`` episodes, played together (``agents.play``)."""
    played = agents.play(endpoint, program, model, rows, num_samples)
    return [[_episode(endpoint, outcome, row) for outcome in outcomes] for outcomes, row in zip(played, rows)]


def _episode(endpoint: Endpoint, outcome: Outcome, row: Dict[str, Any]) -> Episode:
    """The episode as an evaluation keeps it: its last chat call's conversation (the prompt: the messages before the
    model's first reply; the completion: the rest, its reply last), and what its calls wrote."""
    calls = endpoint.calls(outcome.name)
    chats = [call for call in calls if call.messages is not None]
    conversation = (chats[-1].messages or []) + [chats[-1].reply or {}] if chats else []
    first_reply = next((i for i, message in enumerate(conversation) if message.get("role") == "assistant"), 0)
    prompt = conversation[:first_reply] if chats else row.get("prompt")
    said = [call.reply or {} for call in chats]
    return Episode(
        prompt=prompt,
        messages=conversation[first_reply:],
        environment=None,
        calls=sum(len(reply.get("tool_calls") or []) for reply in said),
        turns=len(calls),
        hit_limit=any(call.finish_reason == "length" for call in calls),
        tokens=sum(len(call.completion_ids) for call in calls),
        reward=outcome.reward,
        metrics=outcome.metrics,
        error=outcome.error,
    )
