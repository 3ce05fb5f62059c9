"""Agent programs, the spec's ``agent: {function: module:solve}``: ``async def solve(client, model, row)``, called
once per episode with an ``openai.AsyncOpenAI`` pointed at the job's endpoint (``endpoint.py``), the model's name to
pass, and the row. It returns the episode's reward, or ``{"reward": ..., "metrics": {...}}``.

A process's episodes run side by side, so their calls are generated in
batches. An episode whose program raises, returns no reward or runs past
``agent.timeout_s`` scores 0, with why kept (:class:`Outcome`): one bad
episode does not end the job. A program that blocks its event loop, which
no episode's timeout can then stop, ends the job in one line. What each
episode's calls were, exactly, the endpoint keeps under the episode's name.
"""

import asyncio
import contextlib
import copy
import dataclasses
import inspect
import math
import traceback
from typing import Any, AsyncContextManager, Callable, Dict, List, Optional, Sequence

from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.sections import (
    EPISODES_AT_ONCE,
    USER_CODE_TIMEOUT_S,
    EpisodeProgram,
    VerifiersEnvironment,
    play_bound,
)
from posttrain.entrypoints.generation import verifiers_episodes
from posttrain.entrypoints.generation.endpoint import Endpoint
from posttrain.entrypoints.inputs.models import import_user_function
from posttrain.entrypoints.process.error_file import deadline


@dataclasses.dataclass(frozen=True)
class Program:
    """An agent program as the job runs it: its function, how long one episode may take, and what its episodes
    need held while they play (a verifiers environment's servers), entered on the event loop they play on."""

    solve: Callable[..., Any]
    timeout_s: float
    serving: Callable[[], AsyncContextManager[Any]] = contextlib.nullcontext
    # the spec's section that names it (its timeout_s)
    key: str = "agent"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one episode ended: its name under the endpoint, its reward and metrics, or 0 and why it has none."""

    name: str
    reward: float
    metrics: Dict[str, float]
    error: Optional[str]


def resolve(program: EpisodeProgram) -> Program:
    """The spec's program: its function imported and checked to be an async function taking (client, model, row);
    or its verifiers environment, loaded (``verifiers_episodes.py``)."""
    if isinstance(program, VerifiersEnvironment):
        solve, serving = verifiers_episodes.player(program)
        return Program(solve, program.timeout_s or USER_CODE_TIMEOUT_S, serving, program.key)
    solve = import_user_function(program.function, "agent.function")
    if not inspect.iscoroutinefunction(solve):
        kind = type(solve).__name__
        raise SpecError(
            [
                f"agent.function: {program.function} is a {kind}, not an async function; write async def "
                "solve(client, model, row)"
            ]
        )
    try:
        inspect.signature(solve).bind(None, None, None)
    except TypeError:
        raise SpecError([f"agent.function: {program.function} must take (client, model, row)"]) from None
    return Program(solve, program.timeout_s or USER_CODE_TIMEOUT_S)


def play(
    endpoint: Endpoint, program: Program, model: str, rows: Sequence[Dict[str, Any]], num_samples: int
) -> List[List[Outcome]]:
    """Each row's ``num_samples`` episodes, every one of them in flight together (at most :data:`EPISODES_AT_ONCE`
    at once), each with a client of its own under its own path of the endpoint."""
    # here, not at the top: its import takes 0.7 s, and every training process imports this module
    import openai

    async def all_episodes() -> List[Outcome]:
        at_once = asyncio.Semaphore(EPISODES_AT_ONCE)

        async def episode(number: int, sample: int) -> Outcome:
            async with at_once:
                name = f"row{number}-sample{sample}"
                # the endpoint is this host's: no proxy of the environment's may see the key
                client = openai.AsyncOpenAI(
                    base_url=endpoint.base_url(name),
                    api_key=endpoint.key,
                    max_retries=0,
                    http_client=openai.DefaultAsyncHttpxClient(trust_env=False),
                )
                async with client:
                    return await _outcome(name, program, client, model, rows[number])

        games = [(number, sample) for number in range(len(rows)) for sample in range(num_samples)]
        async with program.serving():
            return await asyncio.gather(*(episode(number, sample) for number, sample in games))

    # each episode is bounded on the event loop; a program that blocks the loop (time.sleep, a blocking client)
    # stops every timer there, so the whole play is bounded apart, on a thread of its own
    games = len(rows) * num_samples
    seconds = play_bound(program.timeout_s, games)
    line = (
        f"posttrain: {program.key}: {games} episode(s) did not end within {seconds:g} s, each bounded by "
        f"{program.key}.timeout_s "
        f"({program.timeout_s:g} s): the program blocks its event loop (time.sleep, a blocking client?); await "
        "the async client it is given"
    )
    with deadline(seconds, line):
        played = asyncio.run(all_episodes())
    return [played[number * num_samples : (number + 1) * num_samples] for number in range(len(rows))]


async def _outcome(name: str, program: Program, client: Any, model: str, row: Dict[str, Any]) -> Outcome:
    try:
        returned = await asyncio.wait_for(program.solve(client, model, copy.deepcopy(row)), program.timeout_s)
    except asyncio.TimeoutError:
        return Outcome(name, 0.0, {}, f"the episode ran past {program.key}.timeout_s ({program.timeout_s:g} s)")
    except Exception:  # noqa: BLE001 -- the program's own failure scores its episode 0; its traceback is kept
        return Outcome(name, 0.0, {}, traceback.format_exc())
    reward, metrics = returned, {}
    if isinstance(returned, dict):
        reward, metrics = returned.get("reward"), returned.get("metrics") or {}
    numbers = isinstance(metrics, dict) and all(_number(value) for value in metrics.values())
    if not _number(reward) or not numbers:
        expected = "expected a number or {'reward': <number>, 'metrics': {<name>: <number>, ...}}"
        return Outcome(name, 0.0, {}, f"the program returned {returned!r}; {expected}")
    return Outcome(name, float(reward), {str(key): float(value) for key, value in metrics.items()}, None)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
