"""An evaluation's samples as episodes, where the spec gives tools or an environment: the model writes calls,
posttrain runs them and returns their results, the model goes on, as GRPO's rollouts do (TRL's
``GRPOTrainer._tool_call_loop``), so that a model is judged as it was trained.

As in training: the prompt is rendered with the tools' schemas (the
environment's public methods among them, after its ``reset(**row)``, whose
text is added to the last message), through the chat template TRL trains
with (``chat_templates.training_template``); the calls are read back with TRL's
parser; a call's error is its result (``{'error': ...}``); the results'
tokens are appended to the episode's, never re-rendered; ``max_new_tokens``
bounds the whole episode (its results' tokens included), and a round of
results that would pass it ends the episode before them;
``max_tool_calling_iterations`` bounds the rounds. In transformers the
samples of a prompt come from its seed, one after the other; in vLLM a
process's episodes are played together, a round of turns at a time, each
turn from a seed of its own. So an episode is the same on any number of
processes (where the tools and environments draw no unseeded random
numbers).
"""

import asyncio
import copy
import dataclasses
import hashlib
import inspect
import itertools
from typing import Any, Callable, ContextManager, Dict, Generator, List, Optional, Sequence, Tuple, Union

import torch
from trl.chat_template_utils import parse_response

from posttrain.components.spec.judging import GenerationSpec
from posttrain.entrypoints.generation.engine import Request, end_tokens, transformers_engine
from posttrain.entrypoints.inputs.tools import ENVIRONMENT_HOOKS

# how the environments an evaluation names are made: one factory, or one per name (each row's environment column)
Factories = Union[None, Callable[[], Any], Dict[str, Callable[[], Any]]]


@dataclasses.dataclass
class Episode:
    """One sample of a prompt, played out: what the scorers see, and what is counted of it."""

    # the prompt the model was given (an environment's reset may add to it), as GRPO's rewards see it
    prompt: Any
    # the completion as GRPO's rewards see it: the model's messages and the tools' results, in order
    messages: List[Dict[str, Any]]
    # the environment it played in (its get_reward scores it), or None
    environment: Any
    calls: int = 0
    failed_calls: int = 0
    # the model's turns: one, and one more after each round of results
    turns: int = 0
    # whether it ended with calls left unanswered (the rounds' limit, or the tokens' budget)
    hit_limit: bool = False
    # the tokens the model wrote (the results' tokens not counted)
    tokens: int = 0
    # an agent program's own outcome (generation/agents.py): its reward (0 where it failed), its metrics, its error
    reward: Optional[float] = None
    metrics: Dict[str, float] = dataclasses.field(default_factory=dict)
    error: Optional[str] = None

    def answer(self) -> str:
        """The text of the model's last turn."""
        said = [message for message in self.messages if message["role"] == "assistant"]
        return str(said[-1].get("content") or "") if said else ""

    def counts(self) -> Dict[str, Any]:
        return {
            "calls": self.calls,
            "failed_calls": self.failed_calls,
            "turns": self.turns,
            "hit_limit": self.hit_limit,
            "tokens": self.tokens,
            "errors": int(self.error is not None),
        }


@dataclasses.dataclass(frozen=True)
class Agent:
    """What an episode may call: the spec's tools (resolved and guarded, inputs/tools.py) and environments."""

    tools: Sequence[Callable[..., Any]]
    environments: Factories

    def environment_for(self, row: Dict[str, Any]) -> Any:
        if self.environments is None:
            return None
        if isinstance(self.environments, dict):
            return self.environments[row["environment"]]()
        return self.environments()


@dataclasses.dataclass(frozen=True)
class Turn:
    """A turn asked of an engine: the episode's tokens so far, the most it may write, its seed, and how it samples
    where not as the spec says (an endpoint's request: vLLM's sampling parameters, the budget aside)."""

    ids: List[int]
    budget: int
    seed: int
    sampling: Optional[Dict[str, Any]] = None


def turn_seed(seed: int, sample: int, turn: int) -> int:
    """The seed of a turn of a prompt's sample (the prompt's ``seed``): the same on any number of processes."""
    digest = hashlib.sha256(f"{seed}/{sample}/{turn}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


# an engine's round of turns: what each wrote
Turns = Callable[[List[Turn]], List[List[int]]]


# an episode as it is played: it yields each turn's request (the tokens so far, the most the turn may write) and
# is sent the tokens written; it returns the episode
Playing = Generator[Tuple[List[int], int], List[int], Episode]


@torch.no_grad()
def play(
    model: Any,
    tokenizer: Any,
    template: Optional[str],
    row: Dict[str, Any],
    agent: Agent,
    generation: GenerationSpec,
    seed: int,
) -> List[Episode]:
    """``generation.num_samples`` episodes of ``row``'s prompt in transformers, one after the other, from ``seed``,
    rendered with ``template`` (``chat_templates.training_template``)."""
    torch.manual_seed(seed)
    engine, ends = transformers_engine(model, tokenizer), tuple(end_tokens(model.generation_config, tokenizer))

    def write(ids: List[int], budget: int) -> List[int]:
        # the model's next turn: up to budget tokens, its end token included (as TRL keeps it)
        request = Request(
            tuple(ids), budget, temperature=generation.temperature, top_p=generation.top_p, stop_token_ids=ends
        )
        return engine([request])[0].ids

    return [
        _played(_playing(tokenizer, template, row, agent, generation), write) for _ in range(generation.num_samples)
    ]


def _played(playing: Playing, write: Callable[[List[int], int], List[int]]) -> Episode:
    """An episode played to its end, each turn written by ``write``."""
    asked = next(playing)
    while True:
        try:
            asked = playing.send(write(*asked))
        except StopIteration as ended:
            return ended.value


def play_together(
    engine: Callable[[int], ContextManager[Turns]],
    tokenizer: Any,
    template: Optional[str],
    rows: Sequence[Dict[str, Any]],
    seeds: Sequence[int],
    agent: Agent,
    generation: GenerationSpec,
) -> List[List[Episode]]:
    """Each row's ``generation.num_samples`` episodes, played together: each round, the next turn of every episode
    still going, from ``engine(longest)`` (vLLM: evaluation/sampling.py), which takes a round's turns and gives
    what each wrote; ``longest``, the most tokens an episode may hold. Every episode's environment is made (and
    reset) before the first round and kept until the last. Each turn is drawn from a seed of its own
    (:func:`turn_seed`), so an episode's draws do not depend on the others played beside it."""
    playing = {
        (number, sample): _playing(tokenizer, template, row, agent, generation)
        for number, row in enumerate(rows)
        for sample in range(generation.num_samples)
    }
    # every episode's first turn: its prompt, rendered (an environment's reset among it)
    going = {game: next(episode) for game, episode in playing.items()}
    ended: Dict[Tuple[int, int], Episode] = {}
    if going:
        longest = max(len(ids) for ids, _ in going.values()) + generation.max_new_tokens
        with engine(longest) as turns:
            # each round gives every episode still going its next turn: the round is that turn's number
            for turn in itertools.count():
                if not going:
                    break
                asked = list(going)
                written = turns([Turn(*going[game], turn_seed(seeds[game[0]], game[1], turn)) for game in asked])
                for game, new in zip(asked, written, strict=True):
                    try:
                        going[game] = playing[game].send(new)
                    except StopIteration as stopped:
                        del going[game]
                        ended[game] = stopped.value
    return [[ended[(number, sample)] for sample in range(generation.num_samples)] for number in range(len(rows))]


def _playing(
    tokenizer: Any, template: Optional[str], row: Dict[str, Any], agent: Agent, generation: GenerationSpec
) -> Playing:
    prompt = copy.deepcopy(row["prompt"])
    environment = agent.environment_for(row)
    tools = list(agent.tools)
    if environment is not None:
        # as TRL: the row as it is, less the column that picks one of several environments
        several = isinstance(agent.environments, dict)
        observation = environment.reset(
            **{key: value for key, value in row.items() if key != "environment" or not several}
        )
        if isinstance(observation, str):
            prompt[-1] = {**prompt[-1], "content": prompt[-1]["content"] + observation}
        tools += [
            getattr(environment, name)
            for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
            if name not in ENVIRONMENT_HOOKS and not name.startswith("_")
        ]
    by_name = {tool.__name__: tool for tool in tools}
    ids = _rendered(tokenizer, template, prompt, tools or None, add_generation_prompt=True)
    episode = Episode(prompt=prompt, messages=[], environment=environment)
    written: List[int] = []
    rounds = generation.max_tool_calling_iterations
    while len(written) < generation.max_new_tokens:
        new = yield ids + written, generation.max_new_tokens - len(written)
        episode.turns += 1
        episode.tokens += len(new)
        message = _parsed(tokenizer, new, ids + written, tools)
        written += new
        episode.messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            return episode
        if rounds is not None and episode.turns > rounds:
            episode.hit_limit = True
            return episode
        results = [_called(call, by_name, episode) for call in calls]
        suffix = _tool_suffix(tokenizer, template, results)
        if len(written) + len(suffix) > generation.max_new_tokens:
            # as TRL drops a round of results that would pass max_completion_length: the episode ends before it
            episode.hit_limit = True
            return episode
        episode.messages += results
        written += suffix
    # the results took the last of the budget: the model has no turn left, as in TRL's loop
    return episode


def _called(call: Dict[str, Any], by_name: Dict[str, Callable[..., Any]], episode: Episode) -> Dict[str, Any]:
    """A tool call's result as a tool message; an error (an unknown tool, bad arguments, the tool's own) is the
    result, as the model reads it in training."""
    episode.calls += 1
    function = call.get("function", {}) if call.get("type") == "function" else {}
    name = function.get("name", call.get("name", "unknown"))
    try:
        if not function:
            raise ValueError(f"Unsupported tool call type: {call.get('type')}")
        if name not in by_name:
            raise ValueError(f"Tool {name} not found.")
        result: Any = by_name[name](**function.get("arguments", {}))
        if inspect.isawaitable(result):
            result = asyncio.run(result)
    except Exception as error:  # noqa: BLE001 -- the model's call failed: its result says so, as in training
        episode.failed_calls += 1
        result = {"error": str(error)}
    return {"role": "tool", "name": name, "content": result if isinstance(result, list) else str(result)}


def _rendered(
    tokenizer: Any, template: Optional[str], messages: List[Dict[str, Any]], tools: Optional[List[Any]], **options: Any
) -> List[int]:
    rendered = tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=template, tokenize=True, return_dict=True, **options
    )
    return list(rendered["input_ids"])


def _tool_suffix(tokenizer: Any, template: Optional[str], results: List[Dict[str, Any]]) -> List[int]:
    """The tokens that follow the model's turn for these results, up to the next turn's opening, as TRL's trainer
    takes them (``_get_tool_suffix_ids``): the template's rendering of a call and its results, less the call's."""
    call = {"type": "function", "function": {"name": results[0]["name"], "arguments": {}}}
    before = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    prefix = _rendered(tokenizer, template, before, None, add_generation_prompt=False)
    ends = [index for index, token in enumerate(prefix) if token == tokenizer.eos_token_id]
    if ends:
        prefix = prefix[: ends[-1] + 1]
    full = _rendered(tokenizer, template, before + results, None, add_generation_prompt=True)
    if full[: len(prefix)] != prefix:
        raise ValueError("the chat template renders a tool call's turn differently once its results follow")
    return full[len(prefix) :]


def _parsed(tokenizer: Any, new: List[int], prefix: List[int], tools: List[Any]) -> Dict[str, Any]:
    """The model's turn as a message, its calls read back with TRL's parser (the one training uses)."""
    return parse_response(tokenizer, new, prefix=prefix, tools=tools)
