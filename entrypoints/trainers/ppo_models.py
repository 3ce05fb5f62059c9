"""PPO's models in its passes: the policy and the value model as one module, and the reference's logits.

Their passes over prompt + response rows are padding-free where every model
attends with varlen kernels (``torch_varlen`` on GPUs, flash attention): the
rows' real tokens packed into one row, each sequence alone
(``speed/rl_padding_free.py``), their outputs put back in the padded places
(0 at padding, which every loss masks). Elsewhere they are the padded rows,
positions skipping the left padding as ``generate`` counts them.
"""

from typing import Optional, Tuple

import torch
import torch.nn as nn
from transformers import PreTrainedModel

from posttrain.entrypoints.speed.rl_padding_free import pack, unpack
from posttrain.entrypoints.trainers.ppo_math import positions


def causal_lm_logits(
    model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, padding_free: bool
) -> torch.Tensor:
    """``[batch, time, vocabulary]``: padding-free, or over the padded rows."""
    if padding_free:
        inputs, mask = pack(input_ids, attention_mask)
        return unpack(model(**inputs).logits, mask)
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions(attention_mask)).logits


def token_values(
    value_model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    position_ids: torch.Tensor,
) -> torch.Tensor:
    """A sequence-classification model's score head applied at every position: ``[batch, time]``."""
    backbone = getattr(value_model, value_model.base_model_prefix)
    hidden = backbone(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state
    return value_model.score(hidden).squeeze(-1).float()


class PolicyAndValue(nn.Module):
    """One module for the policy and the value model, so one DDP wrapper and optimizer serve both."""

    def __init__(self, policy: PreTrainedModel, value_model: PreTrainedModel, padding_free: bool = False) -> None:
        super().__init__()
        self.policy = policy
        self.value_model = value_model
        self.padding_free = padding_free

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        logits = causal_lm_logits(self.policy, input_ids, attention_mask, self.padding_free)
        if not self.padding_free:
            return logits, token_values(self.value_model, input_ids, attention_mask, positions(attention_mask))
        inputs, mask = pack(input_ids, attention_mask)
        return logits, unpack(token_values(self.value_model, inputs["input_ids"], None, inputs["position_ids"]), mask)
