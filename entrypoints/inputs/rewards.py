"""The spec's ``rewards`` in the job: functions, built-ins and reward models, as TRL's online trainers take them.

Two steps, so that a wrong import fails before any model loads and the
reward models load where the trainer is built (after the policy):
:func:`resolve_rewards` imports user code and checks model paths;
:func:`load_reward_models` loads each reward model through the job's one
model loader (``model``'s dtype, revision and trust_remote_code apply),
with its own tokenizer.

Every reward function is wrapped (:class:`RewardCheck`): its scores must be
one finite float (or None) per completion; a user's function is also bounded
(``user_code.py``: its ``timeout_s``, no ``sys.exit``). A NaN on one rank alone would
otherwise skew the group statistics or end that rank with a traceback while
the others wait; the wrapper records the problem, the step ends on zeros in
its place, and at the step's end every rank learns of it and stops together.
"""

import functools
import inspect
import math
import numbers
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch
from transformers import TrainerCallback
from trl.trainer.utils import is_async_callable

from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.rewards import BUILTIN_REWARDS, RewardFunction, builtin_reward, completion_text
from posttrain.components.spec.sections import RewardSource
from posttrain.entrypoints.inputs.models import (
    SEQUENCE_CLASSIFICATION,
    ModelLoading,
    check_model_path,
    import_user_function,
    load_model,
    load_tokenizer,
)
from posttrain.entrypoints.inputs.user_code import guarded
from posttrain.entrypoints.process import distributed


class RewardCheck(TrainerCallback):
    """Checks every reward function's scores; stops all ranks together at the end of a step where one was bad.

    Without a trainer to stop (``stop_at_step_end`` False) a bad score raises at once.
    """

    def __init__(self, stop_at_step_end: bool = True) -> None:
        self.stop_at_step_end = stop_at_step_end
        # this rank's first, without the step (known at the step's end)
        self.problem: Optional[str] = None

    def wrap(self, function: RewardFunction, where: str) -> RewardFunction:
        """``function`` checked on every call, under its own ``__name__`` (TRL logs ``rewards/<name>/mean``)."""
        name = getattr(function, "__name__", type(function).__name__)
        label = f"{where} ({name})"

        # TRL awaits async reward functions (and objects with an async __call__)
        if is_async_callable(function):

            @functools.wraps(function)
            async def checked_async(*args: Any, **kwargs: Any) -> List[Any]:
                return self._checked(await function(*args, **kwargs), kwargs.get("completions"), label)

            checked_async.__name__ = name
            return checked_async

        @functools.wraps(function)
        def checked(*args: Any, **kwargs: Any) -> List[Any]:
            return self._checked(function(*args, **kwargs), kwargs.get("completions"), label)

        checked.__name__ = name
        return checked

    def _checked(self, scores: Any, completions: Optional[Sequence[Any]], label: str) -> List[Any]:
        count = len(completions) if completions is not None else None
        problem, safe = _score_problem(scores, count)
        if problem is None:
            return scores
        if not self.stop_at_step_end:
            raise SpecError([f"{label}: {problem}"])
        self.problem = self.problem or f"{label}: {problem}"
        # zeros: the step ends without NaN in its loss or a crash in the trainer, then all ranks stop
        return safe

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stop_if_any(f"at step {state.global_step}")

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stop_if_any(f"in the evaluation at step {state.global_step}")

    def _stop_if_any(self, when: str) -> None:
        first = distributed.first_message(None if self.problem is None else f"{self.problem} {when}")
        if first is not None:
            raise SpecError([first])


def _score_problem(scores: Any, count: Optional[int]) -> Tuple[Optional[str], List[Any]]:
    """What is wrong with a reward function's scores (None if nothing), and scores safe to go on with."""
    zeros = [0.0] * (count if count is not None else 0)
    if isinstance(scores, (str, bytes, dict)) or not hasattr(scores, "__len__") or not hasattr(scores, "__iter__"):
        return f"returned {type(scores).__name__}; expected a list of one float (or None) per completion", zeros
    if count is not None and len(scores) != count:
        return f"returned {len(scores)} scores for {count} completions; expected one per completion", zeros
    safe, problem = [], None
    for index, score in enumerate(scores):
        # a numpy or torch scalar
        if getattr(score, "ndim", None) == 0:
            score = score.item()
        if score is not None and not isinstance(score, numbers.Real):
            kind = type(score).__name__
            problem = problem or f"returned {score!r} ({kind}) for completion {index}; expected a float or None"
            score = 0.0
        elif score is not None and not math.isfinite(score):
            problem = problem or f"returned {score}"
            score = 0.0
        safe.append(score)
    return problem, safe


def resolve_rewards(
    rewards: Sequence[RewardSource], check: Optional[RewardCheck] = None
) -> List[Union[RewardFunction, str]]:
    """Each reward as a checked function, or the checked path of a reward model; user code is imported now."""
    check = check or RewardCheck(stop_at_step_end=False)
    resolved: List[Union[RewardFunction, str]] = []
    for index, reward in enumerate(rewards):
        where = f"rewards.{index}"
        if reward.builtin is not None:
            resolved.append(check.wrap(builtin_reward(reward.builtin, reward.args), where))
        elif reward.function is not None:
            function = import_user_function(reward.function, f"{where}.function")
            if not callable(function):
                raise SpecError([f"{where}.function: {reward.function} is not callable"])
            resolved.append(check.wrap(guarded(function, where, reward.timeout_s), where))
        else:
            check_model_path(reward.model, f"{where}.model")
            resolved.append(reward.model)
    return resolved


def check_reward_columns(
    rewards: Sequence[RewardSource], keeps_only_prompts: bool, datasets: Sequence[Tuple[str, Any]]
) -> None:
    """A built-in reward that reads a data set column finds it (after data.columns renames), before a model loads;
    and is not removed by a trainer that ``keeps_only_prompts`` (the spec's ``keeps_only_prompts``)."""
    for index, reward in enumerate(rewards):
        if reward.builtin is None:
            continue
        bound = inspect.signature(BUILTIN_REWARDS[reward.builtin]).bind(**reward.args)
        bound.apply_defaults()
        column = bound.arguments.get("column")
        if keeps_only_prompts and column not in (None, "prompt", "image", "images"):
            raise SpecError(
                [
                    f"training.remove_unused_columns: true removes column {column!r}, which rewards.{index} "
                    f"({reward.builtin}) reads: the trainer keeps only prompt and images; set it false"
                ]
            )
        for where, dataset in datasets:
            if column is not None and column not in dataset.column_names:
                raise SpecError(
                    [
                        f"rewards.{index}: {reward.builtin} reads column {column!r}, which {where} lacks; found "
                        f"{dataset.column_names} (set args.column, or map names with data.columns)"
                    ]
                )


def load_reward_models(
    rewards: Sequence[Union[RewardFunction, str]], loading: ModelLoading
) -> Tuple[List[Any], List[Optional[Any]]]:
    """``(reward_funcs, reward_processing_classes)``: each model loaded, with its tokenizer (None beside a function)."""
    funcs: List[Any] = []
    tokenizers: List[Optional[Any]] = []
    for reward in rewards:
        if not isinstance(reward, str):
            funcs.append(reward)
            tokenizers.append(None)
            continue
        tokenizer = load_tokenizer(reward, loading.model, padding_side="right")
        model = load_model(reward, loading, tokenizer, SEQUENCE_CLASSIFICATION)
        # the score is read at the last token before padding: the model must know its tokenizer's pad id
        model.config.pad_token_id = tokenizer.pad_token_id
        funcs.append(model)
        tokenizers.append(tokenizer)
    return funcs, tokenizers


def reward_model_scores(model: Any, tokenizer: Any, prompts: Sequence[Any], completions: Sequence[Any]) -> torch.Tensor:
    """A reward model's score of each prompt with its completion, as TRL's online trainers score them: the text
    (a chat through the reward model's chat template), right-padded, read at the first logit; float32 on the CPU.
    Under the caller's autocast, if any."""
    if isinstance(prompts[0], str):
        texts = [p + completion_text(c) for p, c in zip(prompts, completions)]
    else:
        texts = [tokenizer.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions)]
    encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    return model(**encoded).logits[:, 0].float().cpu()
