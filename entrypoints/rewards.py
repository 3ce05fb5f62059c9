"""The spec's ``rewards`` in the job: functions, built-ins and reward models, as TRL's online trainers take them.

Two steps, so that a wrong import fails before any model loads and the
reward models load where the trainer is built (after the policy):
:func:`resolve_rewards` imports user code and checks model paths;
:func:`load_reward_models` loads each reward model through the job's one
model loader (``model``'s dtype, revision and trust_remote_code apply),
with its own tokenizer.
"""

from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple, Union

from posttrain.components.messages import SpecError
from posttrain.components.rewards import RewardFunction, builtin_reward
from posttrain.components.schema import Spec
from posttrain.entrypoints.models import (
    SEQUENCE_CLASSIFICATION,
    check_model_path,
    import_object,
    load_model,
    load_tokenizer,
)


def has_rewards(spec: Spec) -> bool:
    """Whether the algorithm scores its samples with ``rewards`` (a field of its spec class)."""
    return "rewards" in type(spec).model_fields


def resolve_rewards(spec: Spec) -> List[Union[RewardFunction, str]]:
    """Each reward as a function, or the checked path of a reward model; user code is imported now."""
    resolved: List[Union[RewardFunction, str]] = []
    for index, reward in enumerate(spec.rewards if has_rewards(spec) else []):
        where = f"rewards.{index}"
        if reward.builtin is not None:
            resolved.append(builtin_reward(reward.builtin, reward.args))
        elif reward.function is not None:
            try:
                function = import_object(reward.function)
            except (ImportError, AttributeError) as error:
                raise SpecError(
                    [f"{where}.function: cannot import {reward.function} from {Path.cwd()}: {error}"]
                ) from None
            if not callable(function):
                raise SpecError([f"{where}.function: {reward.function} is not callable"])
            resolved.append(function)
        else:
            check_model_path(reward.model, f"{where}.model")
            resolved.append(reward.model)
    return resolved


def load_reward_models(
    rewards: Sequence[Union[RewardFunction, str]], spec: Spec
) -> Tuple[List[Any], List[Optional[Any]]]:
    """``(reward_funcs, reward_processing_classes)``: each model loaded, with its tokenizer (None beside a function)."""
    funcs: List[Any] = []
    tokenizers: List[Optional[Any]] = []
    for reward in rewards:
        if not isinstance(reward, str):
            funcs.append(reward)
            tokenizers.append(None)
            continue
        tokenizer = load_tokenizer(reward, spec, padding_side="right")
        model = load_model(reward, spec, tokenizer, SEQUENCE_CLASSIFICATION)
        # the score is read at the last token before padding: the model must know its tokenizer's pad id
        model.config.pad_token_id = tokenizer.pad_token_id
        funcs.append(model)
        tokenizers.append(tokenizer)
    return funcs, tokenizers
