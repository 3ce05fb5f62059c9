"""Scoring a prompt's completions: each scorer as a function (a reward model loaded to score as TRL's online trainers
do), called as GRPO calls a reward, its scores as numbers."""

import asyncio
import inspect
from typing import Any, Callable, Dict, List, Optional

import torch

from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.sections import ModelSpec
from posttrain.entrypoints.evaluation.episodes import Episode
from posttrain.entrypoints.inputs.models import ModelLoading
from posttrain.entrypoints.inputs.rewards import load_reward_models, reward_model_scores


def scorer(resolved: Any) -> Callable[..., Any]:
    """A scorer as a function: a reward model (its path) loaded on this rank's GPU where it has one, scoring as
    TRL's online trainers do."""
    if not isinstance(resolved, str):
        return resolved
    [model], [tokenizer] = load_reward_models([resolved], ModelLoading(ModelSpec(name_or_path=resolved)))
    model.eval().requires_grad_(False)
    if torch.cuda.is_available():
        model.to(torch.device("cuda", torch.cuda.current_device()))

    def scored(prompts: List[Any], completions: List[Any], **columns: Any) -> List[float]:
        with torch.inference_mode():
            return reward_model_scores(model, tokenizer, prompts, completions).tolist()

    return scored


def environment_scorer(name: Optional[str]) -> Callable[..., List[Any]]:
    """An environment's ``get_reward`` as a scorer, as TRL's GRPO makes it one: each episode's environment asked,
    where it is this one (``name``: among several, the row's ``environment`` column; None: the only one)."""

    def get_reward(environments: List[Any], environment: Optional[List[str]] = None, **columns: Any) -> List[Any]:
        scores = []
        for number, played in enumerate(environments):
            score = played.get_reward() if name is None or (environment or [])[number] == name else None
            # an async get_reward, as TRL's GRPO awaits it
            scores.append(asyncio.run(score) if inspect.isawaitable(score) else score)
        return scores

    return get_reward


def program_scorer() -> Callable[..., List[Any]]:
    """An agent program's reward as a scorer: what each episode's program returned (0 where it failed)."""

    def reward(agent_rewards: List[float], **columns: Any) -> List[float]:
        return agent_rewards

    return reward


def result(
    name: str,
    index: int,
    row: Dict[str, Any],
    texts: List[str],
    scorers: Dict[str, Callable[..., Any]],
    episodes: Optional[List[Episode]] = None,
) -> Dict[str, Any]:
    """A prompt's completions, scored: a line of a part file. ``episodes``: the samples as episodes (the texts their
    last turns), which the scorers see whole, with their environments, as GRPO's rewards do."""
    prompt = row["prompt"]
    # as TRL's trainers give them: a chat prompt's completion is the assistant's message
    completions = [[{"role": "assistant", "content": t}] for t in texts] if not isinstance(prompt, str) else texts
    columns = {key: [value] * len(texts) for key, value in row.items() if key != "prompt"}
    prompts = [prompt] * len(texts)
    if episodes is not None:
        # the prompts as each episode's model was given them (an environment's reset may add to them)
        prompts = [episode.prompt for episode in episodes]
        completions = [episode.messages for episode in episodes]
        if any(episode.environment is not None for episode in episodes):
            columns["environments"] = [episode.environment for episode in episodes]
        if any(episode.reward is not None for episode in episodes):
            columns["agent_rewards"] = [episode.reward for episode in episodes]
    # what the scorers logged of each completion (TRL's log_extra: code_tests' failures), kept with it
    extra: Dict[str, List[Any]] = {}
    scored = {scorer: scores(function, prompts, completions, columns, extra) for scorer, function in scorers.items()}
    result = {"model": name, "index": index, "prompt": prompt, "completions": texts, "scores": scored}
    if episodes is not None:
        result["episodes"] = [{"messages": episode.messages, **episode.counts()} for episode in episodes]
        for kept, episode in zip(result["episodes"], episodes):
            if episode.reward is not None:
                kept.update(error=episode.error, metrics=episode.metrics)
    if extra:
        result["extra"] = extra
    return result


def scores(
    function: Callable[..., Any],
    prompts: List[Any],
    completions: List[Any],
    columns: Dict[str, Any],
    extra: Optional[Dict[str, List[Any]]] = None,
) -> List[Any]:
    """A scorer's scores of one prompt's completions, as numbers (None: not scored); a bad one is this rank's to
    say (the others' prompts may be fine). What it logs through ``log_extra``, as TRL's GRPO and RLOO offer it,
    goes into ``extra`` (a column's values, one per completion), where the scorer takes that argument."""
    offered = {}
    if extra is not None:
        try:
            parameters = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):
            parameters = []
        if any(parameter.name == "log_extra" or parameter.kind is parameter.VAR_KEYWORD for parameter in parameters):
            offered["log_extra"] = lambda column, values: extra.setdefault(column, []).extend(values)
    try:
        scored = function(prompts=prompts, completions=completions, **columns, **offered)
        # an async scorer, as TRL's trainers take them: awaited here
        if inspect.isawaitable(scored):
            scored = asyncio.run(scored)
    except SpecError as error:
        raise SpecError(error.problems, this_rank_only=True) from None
    return [None if score is None else float(score) for score in scored]
