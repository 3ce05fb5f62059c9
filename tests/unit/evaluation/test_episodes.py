"""Episodes played together, a round of turns at a time (as vLLM plays them: ``episodes.play_together``), with the
tiny tools model's real tokenizer and chat template and the shipped rooms; the turns are written by a script (the
model's part: tests/e2e/test_vllm.py plays the trained model in vLLM)."""

import contextlib
import re
from typing import Any, Iterator, List

import pytest

from posttrain.components.spec.judging import GenerationSpec
from posttrain.entrypoints.evaluation import episodes
from posttrain.entrypoints.inputs.chat_templates import training_template
from posttrain.templates.tools.hidden_value import Room

PEEK = '<tool_call>\n{"name": "peek", "arguments": {}}\n</tool_call><|im_end|>'


class Scripted:
    """An engine whose turns call ``peek`` first, then answer what the last result said; each round recorded."""

    def __init__(self, tokenizer: object) -> None:
        self.tokenizer = tokenizer
        self.rounds: List[List[episodes.Turn]] = []
        self.longest = 0

    @contextlib.contextmanager
    def __call__(self, longest: int) -> Iterator[episodes.Turns]:
        self.longest = longest
        yield self.turns

    def turns(self, asked: List[episodes.Turn]) -> List[List[int]]:
        self.rounds.append(asked)
        written = []
        for turn in asked:
            text = self.tokenizer.decode(turn.ids)
            results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text)
            said = f"It is {results[-1]}.<|im_end|>" if results else PEEK
            written.append(self.tokenizer.encode(said, add_special_tokens=False)[: turn.budget])
        return written


@pytest.fixture(scope="module")
def tokenizer(tools_tokenizer: Any) -> Any:
    return tools_tokenizer


def test_episodes_played_together_each_in_its_room_turn_by_turn_with_seeds_of_their_own(tokenizer: object) -> None:
    rows = [
        {"prompt": [{"role": "user", "content": "What is the value hidden in the room?"}], "answer": a} for a in "37"
    ]
    agent = episodes.Agent(tools=[], environments=Room)
    generation = GenerationSpec(num_samples=2, max_new_tokens=64, max_tool_calling_iterations=2)
    engine = Scripted(tokenizer)
    template = training_template(tokenizer)
    played = episodes.play_together(engine, tokenizer, template, rows, [11, 12], agent, generation)

    assert [[episode.answer() for episode in row] for row in played] == [["It is 3."] * 2, ["It is 7."] * 2]
    for row, answer in zip(played, "37"):
        for episode in row:
            assert [message["role"] for message in episode.messages] == ["assistant", "tool", "assistant"]
            assert episode.messages[1]["content"] == answer
            assert episode.counts() == {
                "calls": 1,
                "failed_calls": 0,
                "turns": 2,
                "hit_limit": False,
                "tokens": episode.tokens,
                "errors": 0,
            }
    # two rounds of the four episodes: a call each, then an answer each, every turn from a seed of its own
    assert [len(asked) for asked in engine.rounds] == [4, 4]
    seeds = [turn.seed for asked in engine.rounds for turn in asked]
    assert len(set(seeds)) == 8
    assert engine.rounds[1][3].seed == episodes.turn_seed(12, 1, 1)
    # the budget is the episode's: the second turn's is what the first and the result left
    first, second = engine.rounds[0][0], engine.rounds[1][0]
    assert second.budget == 64 - (len(second.ids) - len(first.ids))
    assert engine.longest == len(first.ids) + 64


def test_an_episode_played_beside_others_is_the_one_played_alone(tokenizer: object) -> None:
    rows = [
        {"prompt": [{"role": "user", "content": "What is the value hidden in the room?"}], "answer": a} for a in "3719"
    ]
    agent = episodes.Agent(tools=[], environments=Room)
    generation = GenerationSpec(num_samples=1, max_new_tokens=64)
    template = training_template(tokenizer)
    together = episodes.play_together(Scripted(tokenizer), tokenizer, template, rows, [5, 6, 7, 8], agent, generation)
    alone = episodes.play_together(Scripted(tokenizer), tokenizer, template, rows[2:3], [7], agent, generation)
    assert together[2][0].messages == alone[0][0].messages
