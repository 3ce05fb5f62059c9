"""How posttrain's own generation (PPO's rollouts, an evaluation's samples) turns a prompt into tokens and samples
from a model: one place, so that what PPO trained on and what an evaluation measures are written alike."""

import contextlib
from typing import Any, Iterator, List

from transformers import GenerationConfig, PreTrainedModel


def prompt_ids(tokenizer: Any, prompt: Any) -> List[int]:
    """A prompt's tokens: chat messages through the chat template, with the assistant's turn opened (the template
    writes any BOS itself); text as the tokenizer encodes it, with its BOS, as the model saw text in training."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    return list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=True)["input_ids"])


@contextlib.contextmanager
def sampling_from_the_logits(policy: PreTrainedModel) -> Iterator[None]:
    """Generation samples from softmax(logits / temperature) alone, as the log-probs PPO trains on assume.

    transformers fills every sampling setting ``generate`` is not given from
    the model's ``generation_config.json`` (an instruct model's repetition
    penalty, top-k, min-p, ...), which would make the sampling distribution
    differ from the one the ratio and the KL are computed with. The model's
    own generation config is back in place afterwards, so it is saved as it came.
    """
    saved = policy.generation_config
    policy.generation_config = GenerationConfig(
        bos_token_id=saved.bos_token_id, eos_token_id=saved.eos_token_id, pad_token_id=saved.pad_token_id
    )
    try:
        yield
    finally:
        policy.generation_config = saved
