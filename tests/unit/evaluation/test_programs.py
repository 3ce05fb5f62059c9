"""Agent programs' episodes (generation/agents.py, evaluation/programs.py) against the endpoint over a scripted engine, with
the tiny tools model's real tokenizer: what an episode keeps and scores, and how a program that fails ends (the
trained models play the template's program through ``torchx run``: tests/e2e/test_tools.py)."""

import asyncio
import json
from pathlib import Path
from typing import Any, Dict, List, Sequence

import pytest

from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.sections import AgentProgram
from posttrain.entrypoints.evaluation import programs
from posttrain.entrypoints.generation import agents
from posttrain.entrypoints.generation.endpoint import Endpoint
from posttrain.entrypoints.generation.engine import Completion, Request
from posttrain.templates.agents import calculator, rooms

PEEK = '<tool_call>\n{"name": "peek", "arguments": {}}\n</tool_call><|im_end|>'
ROWS = [{"prompt": [{"role": "user", "content": "What is the value hidden in the room?"}], "answer": a} for a in "37"]


@pytest.fixture(scope="module")
def tokenizer(tools_tokenizer: Any) -> Any:
    return tools_tokenizer


def scripted(tokenizer: Any) -> Any:
    """An engine that peeks where no result has come back yet, else answers the last result."""

    def engine(requests: Sequence[Request]) -> List[Completion]:
        written = []
        for request in requests:
            text = tokenizer.decode(request.prompt_ids)
            said = text.rsplit("<tool_response>\n", 1)[1][0] + "<|im_end|>" if "<tool_response>" in text else PEEK
            ids = tokenizer.encode(said, add_special_tokens=False)
            written.append(Completion(ids, [-0.1] * len(ids), "stop"))
        return written

    return engine


def played(tokenizer: Any, solve: Any, num_samples: int = 2, timeout_s: float = 30) -> List[List[Any]]:
    endpoint = Endpoint(scripted(tokenizer), tokenizer, None, "policy", 512, [tokenizer.eos_token_id])
    with endpoint.serving():
        return programs.play(endpoint, agents.Program(solve, timeout_s), "policy", ROWS, num_samples)


def test_the_rooms_program_plays_each_episode_through_the_endpoint_and_keeps_its_transcript(tokenizer: Any) -> None:
    episodes = played(tokenizer, rooms.solve)
    for row, answer in zip(episodes, "37"):
        for episode in row:
            assert (episode.reward, episode.metrics, episode.error) == (1.0, {"peeked": 1.0}, None)
            assert episode.prompt == ROWS[0]["prompt"]
            assert [message["role"] for message in episode.messages] == ["assistant", "tool", "assistant"]
            assert episode.messages[0]["tool_calls"] == [
                {"type": "function", "function": {"name": "peek", "arguments": {}}}
            ]
            assert episode.messages[1] == {"role": "tool", "content": answer, "name": "peek"}
            assert episode.answer() == answer
            assert (episode.calls, episode.turns, episode.hit_limit, episode.counts()["errors"]) == (1, 2, False, 0)
            assert episode.tokens == len(tokenizer.encode(PEEK, add_special_tokens=False)) + 2


async def raises(client: Any, model: str, row: Dict[str, Any]) -> float:
    await client.chat.completions.create(model=model, messages=row["prompt"])
    raise RuntimeError("the agent's own bug")


async def hangs(client: Any, model: str, row: Dict[str, Any]) -> float:
    await asyncio.sleep(60)
    return 1.0


async def says_yes(client: Any, model: str, row: Dict[str, Any]) -> str:
    return "yes"


async def measures_in_words(client: Any, model: str, row: Dict[str, Any]) -> Dict[str, Any]:
    return {"reward": 1.0, "metrics": {"calls": "n/a"}}


async def asks_a_model_it_does_not_have(client: Any, model: str, row: Dict[str, Any]) -> float:
    await client.chat.completions.create(model="gpt-4o", messages=row["prompt"])
    return 1.0


@pytest.mark.parametrize(
    "solve, why",
    [
        (raises, "RuntimeError: the agent's own bug"),
        (hangs, "the episode ran past agent.timeout_s (0.5 s)"),
        (
            says_yes,
            "the program returned 'yes'; expected a number or {'reward': <number>, 'metrics': {<name>: <number>",
        ),
        (measures_in_words, "the program returned {'reward': 1.0, 'metrics': {'calls': 'n/a'}}; expected a number"),
        (asks_a_model_it_does_not_have, "The model `gpt-4o` does not exist: this endpoint serves `policy`"),
    ],
)
def test_an_episode_whose_program_fails_scores_0_counted_with_why_and_the_others_go_on(
    tokenizer: Any, solve: Any, why: str
) -> None:
    # the hang's bound short; the others' long enough for their calls on a busy machine
    episodes = [episode for row in played(tokenizer, solve, timeout_s=0.5 if solve is hangs else 60) for episode in row]
    assert len(episodes) == 4
    for episode in episodes:
        assert episode.reward == 0.0 and why in episode.error and episode.counts()["errors"] == 1


def test_a_program_is_an_async_function_of_client_model_and_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_agents.py").write_text(
        "def blocking(client, model, row):\n    return 1.0\n\nasync def two(client, model):\n    return 1.0\n"
        "\nasync def solve(client, model, row):\n    return 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, problem in (
        ("blocking", "agent.function: my_agents:blocking is a function, not an async function; write async def solve"),
        ("two", "agent.function: my_agents:two must take (client, model, row)"),
        ("missing", "agent.function: cannot import my_agents:missing from"),
    ):
        with pytest.raises(SpecError) as error:
            agents.resolve(AgentProgram(function=f"my_agents:{name}"))
        assert error.value.problems[0].startswith(problem), error.value.problems
    resolved = agents.resolve(AgentProgram(function="my_agents:solve"))
    assert resolved.solve.__name__ == "solve" and resolved.timeout_s == 600


@pytest.mark.parametrize(
    "expression, reward, failed",
    [("57 * 47 - 281", 1.0, 0.0), ("57 ** 47", 0.0, 1.0)],
    ids=["right", "not-arithmetic"],
)
def test_the_calculator_program_runs_the_model_s_calls_and_scores_its_last_reply(
    tokenizer: Any, expression: str, reward: float, failed: float
) -> None:
    """templates/agents/calculator.py: the model's call runs, its result (or error) comes back, and math_verify
    scores the reply after it."""
    call = json.dumps({"name": "calculate", "arguments": {"expression": expression}})

    def engine(requests: Sequence[Request]) -> List[Completion]:
        written = []
        for request in requests:
            text = tokenizer.decode(request.prompt_ids)
            result = text.rsplit("<tool_response>\n", 1)[1].split("\n")[0] if "<tool_response>" in text else None
            said = f"<tool_call>\n{call}\n</tool_call><|im_end|>" if result is None else f"{result}<|im_end|>"
            ids = tokenizer.encode(said, add_special_tokens=False)
            written.append(Completion(ids, [-0.1] * len(ids), "stop"))
        return written

    problem = {"prompt": [{"role": "user", "content": "57 crates of 47 boxes, 281 sold: how many left?"}]}
    endpoint = Endpoint(engine, tokenizer, None, "policy", 512, [tokenizer.eos_token_id])
    with endpoint.serving():
        [[episode]] = programs.play(
            endpoint, agents.Program(calculator.solve, 60), "policy", [{**problem, "answer": "2398"}], 1
        )
    assert (episode.reward, episode.metrics, episode.error) == (reward, {"calls": 1.0, "failed_calls": failed}, None)
    assert episode.messages[1]["content"] == (
        "2398" if failed == 0 else "error: not arithmetic: '57 ** 47'; use numbers, + - * / and parentheses"
    )
