"""GRPO's rollouts played by an agent program (the spec's ``agent:``, ``agents.py``), as TRL's ``rollout_func``
takes them: each of a process's rows one episode, played against an endpoint over the policy as it is at this step,
and trained on exactly the tokens the endpoint gave.

An episode whose calls each extend the one before (the next call's prompt
starts with the last call's prompt and completion, token for token, as
the endpoint prompts a call that goes on with its conversation) trains as
one sequence: the first call's prompt, then everything after it, where only
what the model wrote counts in the loss (``env_mask``; tool results and
other messages between the calls are masked out), cut at
``max_completion_length`` as TRL's tool loop cuts its rollouts. An episode
that made no call trains on nothing and keeps its reward (0 where its
program failed); one whose calls do not extend each other trains on nothing
and is left out of its group's scores (``agent/untrainable``).
"""

import copy
import dataclasses
import functools
import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from accelerate.utils import gather_object
from trl.models import unwrap_model_for_generation

from posttrain.entrypoints.generation import agents
from posttrain.entrypoints.generation.agents import Outcome, Program
from posttrain.entrypoints.generation.endpoint import Call, Endpoint, over_model
from posttrain.entrypoints.generation.engine import Engine, end_tokens
from posttrain.entrypoints.generation.sampling import prompt_ids
from posttrain.entrypoints.generation.vllm_engine import vllm_engine
from posttrain.entrypoints.inputs.chat_templates import training_template, with_response_schema

log = logging.getLogger("posttrain")

# the column of each episode's reward, as TRL hands a rollout's extra fields to the reward functions
REWARD_COLUMN = "agent_reward"


@dataclasses.dataclass(frozen=True)
class Sample:
    """An episode as GRPO trains it: a prompt, and a completion whose ``env_mask`` marks what the model wrote."""

    prompt_ids: List[int]
    completion_ids: List[int]
    logprobs: List[float]
    env_mask: List[int]


class NotOneSequence(ValueError):
    """An episode whose calls do not extend each other: it cannot train as one sequence."""


def sample(calls: Sequence[Call]) -> Sample:
    """The episode's calls as one sequence, each extending the one before; :class:`NotOneSequence` where one does
    not."""
    first = calls[0]
    completion, logprobs = list(first.completion_ids), list(first.logprobs)
    mask = [1] * len(completion)
    so_far = first.prompt_ids + first.completion_ids
    for number, call in enumerate(calls[1:], 2):
        if call.prompt_ids[: len(so_far)] != so_far:
            raise NotOneSequence(
                f"its call {number} does not extend its call {number - 1} (its prompt does not start with that "
                "call's prompt and completion, token for token)"
            )
        between = call.prompt_ids[len(so_far) :]
        completion += between + call.completion_ids
        logprobs += [0.0] * len(between) + call.logprobs
        mask += [0] * len(between) + [1] * len(call.completion_ids)
        so_far = call.prompt_ids + call.completion_ids
    return Sample(first.prompt_ids, completion, logprobs, mask)


class AgentRollouts:
    """GRPO's ``rollout_func`` for ``program``, passing ``model_name`` as the model; :meth:`attach` to the trainer
    gives each rollout its row, :meth:`reward` is the reward function of the program's rewards."""

    def __init__(self, program: Program, scorer_name: str, model_name: str) -> None:
        self.program, self.scorer_name, self.model_name = program, scorer_name, model_name
        self._rows: List[Dict[str, Any]] = []
        self._tokenizer: Any = None
        self._template: Optional[str] = None
        # with training.use_vllm: the engine over TRL's vLLM and its length, made at the first rollout
        self._vllm: Optional[Tuple[Engine, int]] = None

    def attach(self, trainer: Any) -> None:
        """Keeps the rows of each batch the trainer generates for (TRL hands ``rollout_func`` their prompts alone),
        and makes the tokenizer and template the endpoint renders with, once."""
        # the endpoint reads the model's calls back with TRL's parser; TRL's own tokenizer decodes as without tools
        self._tokenizer = with_response_schema(copy.copy(trainer.processing_class))
        self._template = training_template(self._tokenizer)
        score = trainer._generate_and_score_completions

        @functools.wraps(score)
        def scored(inputs: List[Dict[str, Any]]) -> Any:
            self._rows = inputs
            return score(inputs)

        trainer._generate_and_score_completions = scored

    def __call__(self, prompts: List[Any], trainer: Any) -> Dict[str, List[Any]]:
        rows = self._rows
        assert len(rows) == len(prompts), "AgentRollouts.attach(trainer) gives rollouts their rows"
        args, tokenizer = trainer.args, self._tokenizer
        with unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=args.ds3_gather_for_generation
        ) as model:
            endpoint = self._endpoint(trainer, model)
            with endpoint.serving():
                outcomes = [outcome for [outcome] in agents.play(endpoint, self.program, self.model_name, rows, 1)]
        samples: List[Sample] = []
        # None: an episode left out of its group's scores (TRL's unscorable rollout)
        rewards: List[Optional[float]] = []
        for outcome, row in zip(outcomes, rows):
            calls = endpoint.calls(outcome.name)
            try:
                samples.append(sample(calls) if calls else _nothing_trained(tokenizer, row))
                rewards.append(outcome.reward)
            except NotOneSequence as why:
                log.warning("agent: episode %s trains on nothing: %s (docs: Agents)", outcome.name, why)
                samples.append(_nothing_trained(tokenizer, row))
                rewards.append(None)
        self._log(trainer, outcomes, untrainable=rewards.count(None))
        cut = args.max_completion_length
        return {
            "prompt_ids": [s.prompt_ids for s in samples],
            "completion_ids": [s.completion_ids[:cut] for s in samples],
            "logprobs": [s.logprobs[:cut] for s in samples],
            "env_mask": [s.env_mask[:cut] for s in samples],
            REWARD_COLUMN: rewards,
        }

    def _endpoint(self, trainer: Any, model: Any) -> Endpoint:
        """An endpoint over the policy at this step: its vLLM engine, which TRL has given this step's weights, or
        ``model`` in transformers."""
        args, tokenizer = trainer.args, self._tokenizer
        sampling = (args.temperature, args.top_p)
        if not args.use_vllm:
            return over_model(model, tokenizer, self._template, self.model_name, sampling, args.max_completion_length)
        if self._vllm is None:
            self._vllm = vllm_engine(trainer.vllm_generation)
        engine, length = self._vllm
        ends = end_tokens(model.generation_config, tokenizer)
        return Endpoint(
            engine, tokenizer, self._template, self.model_name, length, ends, None, sampling, args.max_completion_length
        )

    def reward(self) -> Callable[..., List[Optional[float]]]:
        """The reward function of the program's rewards, named as the program's function is (``solve``)."""

        def reward(completions: List[Any], **columns: Any) -> List[Optional[float]]:
            return list(columns[REWARD_COLUMN])

        reward.__name__ = reward.__qualname__ = self.scorer_name
        return reward

    def _log(self, trainer: Any, outcomes: List[Outcome], untrainable: int) -> None:
        """The shares of episodes whose program failed (``agent/errors``) and that trained on nothing for calls
        not extending each other (``agent/untrainable``), and the mean of each metric the programs returned
        (``agent/<name>``), over every process's episodes; each failure's last line, where it happened."""
        for outcome in outcomes:
            if outcome.error is not None:
                log.warning("agent: episode %s scored 0: %s", outcome.name, outcome.error.strip().splitlines()[-1])
        everyone = gather_object([(o.error is not None, o.metrics) for o in outcomes])
        left_out = sum(gather_object([untrainable]))
        metrics = trainer._metrics["train" if trainer.model.training else "eval"]
        metrics["agent/errors"].append(sum(failed for failed, _ in everyone) / len(everyone))
        metrics["agent/untrainable"].append(left_out / len(everyone))
        names = sorted({name for _, returned in everyone for name in returned})
        for name in names:
            values = [returned[name] for _, returned in everyone if name in returned]
            metrics[f"agent/{name}"].append(sum(values) / len(values))


def _nothing_trained(tokenizer: Any, row: Dict[str, Any]) -> Sample:
    """An episode that trains on nothing (it made no call, or its calls are not one sequence): its row's prompt, and
    one end token that the loss does not count."""
    return Sample(prompt_ids(tokenizer, row["prompt"]), [tokenizer.eos_token_id], [0.0], [0])
