"""What chat rows need of the tokenizer's chat template, checked before any model loads.

TRL renders conversational rows with the tokenizer's chat template while it
builds the trainer, once the models have loaded: a tokenizer without a
template (most base models') raised "Cannot use chat template functions"
there, and ``assistant_only_loss`` with a template that neither marks the
assistant's turns (``{% generation %}``) nor is one TRL knows how to mark
raised "The chat template is not training-compatible". Reward models score
chat completions rendered with their own tokenizer's template (TRL's GRPO
and RLOO, our PPO): one without a template raised at the first step.
"""

import copy
import os
from typing import Any, List, Optional, Sequence, Tuple, Union

from trl.chat_template_utils import (
    add_response_schema,
    get_training_chat_template,
    has_generation_markers,
    is_chat_template_prefix_preserving,
)
from trl.data_utils import is_conversational

from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.sections import ModelSpec
from posttrain.entrypoints.inputs.models import load_tokenizer
from posttrain.entrypoints.inputs.rewards import RewardFunction

# what TRL's SFT and reward trainers read as a template file; any other chat_template_path names a tokenizer to
# clone (a directory or a Hub id)
TEMPLATE_FILES = (".jinja", ".j2")


def check_chat_template(args: Any, tokenizer: Any, datasets: Sequence[Tuple[str, Any]], model: str) -> None:
    """The chat template renders the data's chat rows, and marks the assistant's turns for ``assistant_only_loss``.

    ``model``: the name the spec gives the tokenizer's model, for the message.
    """
    path: Optional[str] = getattr(args, "chat_template_path", None)
    if path is not None and path.endswith(TEMPLATE_FILES) and not os.path.isfile(path):
        raise SpecError([f"training.chat_template_path: no such file: {path} (relative paths start at {os.getcwd()})"])
    if path is not None and os.path.isfile(path) and not path.endswith(TEMPLATE_FILES):
        raise SpecError(
            [
                f"training.chat_template_path: {path} is a file, and the trainer reads templates from "
                f"{' or '.join(TEMPLATE_FILES)} files only (any other path names a tokenizer to copy the "
                "template from); rename it"
            ]
        )
    chat = _chat_rows(datasets)
    if not chat or (path is not None and not path.endswith(TEMPLATE_FILES)):
        # no chat rows, or the template comes from a tokenizer the trainer clones
        return
    if path is not None:
        with open(path, encoding="utf-8") as file:
            template, source = file.read(), f"training.chat_template_path ({path})"
    else:
        template, source = tokenizer.chat_template, f"the chat template of {model}"
    if template is None:
        raise SpecError(
            [
                f"{chat[0]}: its rows are chat messages, and the tokenizer of {model} has no chat template "
                "to render them; use a model that has one (an instruct model), give a template file as "
                "training.chat_template_path where the trainer takes one, or give text rows"
            ]
        )
    if not getattr(args, "assistant_only_loss", False) or has_generation_markers(template):
        return
    marked = copy.copy(tokenizer)
    marked.chat_template = template
    try:
        get_training_chat_template(marked)
    except ValueError:
        raise SpecError(
            [
                f"training.assistant_only_loss: {source} has no {{% generation %}} markers around the "
                "assistant's turns, and TRL does not know how to add them to it; add them in a template "
                "file given as training.chat_template_path, or drop assistant_only_loss"
            ]
        ) from None


def check_reward_templates(
    rewards: Sequence[Union[RewardFunction, str]], model: ModelSpec, datasets: Sequence[Tuple[str, Any]]
) -> None:
    """Each reward model (``rewards``: functions, and reward models' paths) has a template for chat completions."""
    chat = _chat_rows(datasets)
    for index, reward in enumerate(rewards):
        # a function, or text prompts
        if not chat or not isinstance(reward, str):
            continue
        if load_tokenizer(reward, model, padding_side="right").chat_template is None:
            raise SpecError(
                [
                    f"rewards.{index}: {chat[0]}'s rows are chat messages, which the reward model {reward} "
                    "scores rendered with its tokenizer's chat template, and it has none; give the reward "
                    "model a tokenizer with one (train it on chat rows), or give text prompts"
                ]
            )


def _chat_rows(datasets: Sequence[Tuple[str, Any]]) -> List[str]:
    """Where the rows are chat messages."""
    return [where for where, dataset in datasets if len(dataset) and is_conversational(dataset[0])]


def training_template(tokenizer: Any) -> Optional[str]:
    """The chat template GRPO's rollouts are rendered with: TRL's patched one where the model's own renders a
    turn differently once later messages follow (Qwen3's), else the model's own (None)."""
    return None if is_chat_template_prefix_preserving(tokenizer) else get_training_chat_template(tokenizer)


def with_response_schema(tokenizer: Any) -> Any:
    """``tokenizer`` with the schema TRL reads a model's calls back with, where it has none of its own."""
    if not (getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None)):
        add_response_schema(tokenizer)
    return tokenizer
