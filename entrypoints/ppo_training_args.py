"""How our PPO trainer honours ``TrainingArguments`` the way HF's Trainer does.

The optimizer (``optim``, ``optim_args``, the Adam fields, weight decay on all
but biases and norms) through HF's own helpers, activation checkpointing that
also works in eval mode (the PPO trainer keeps every model in eval mode), and
``logging_steps`` / ``save_steps`` given as fractions of the run.
"""

import functools
import math
from typing import Any, Dict, Optional

import torch
import torch.nn as nn
from transformers import PreTrainedModel, Trainer, TrainingArguments
from transformers.modeling_layers import GradientCheckpointingLayer

from posttrain.components.spec.registry import PPOSpec


def enable_activation_checkpointing(model: PreTrainedModel, options: Optional[Dict[str, Any]]) -> None:
    """HF's activation checkpointing (``activation_checkpointing_kwargs``), applied in eval mode too.

    HF checkpoints a decoder layer only while the layer is in training mode,
    and this trainer keeps every model in eval mode (no dropout), so HF's
    switch alone would checkpoint nothing. HF still marks the layers (every
    ``every_n_layers``-th) and builds the checkpoint function (``offload``,
    ``use_reentrant``, ...); here each marked layer runs through that function
    whenever gradients are recorded, its forward unchanged (in eval mode).
    """
    kwargs = dict(options or {})
    every_n_layers, offload = kwargs.pop("every_n_layers", 1), kwargs.pop("offload", False)
    model.activation_checkpointing_enable(
        activation_checkpointing_kwargs=kwargs or None, every_n_layers=every_n_layers, offload=offload
    )
    for layer in model.modules():
        if isinstance(layer, GradientCheckpointingLayer) and layer.gradient_checkpointing:
            layer.forward = functools.partial(_checkpointed_forward, layer)


def _checkpointed_forward(layer: GradientCheckpointingLayer, *args: Any, **kwargs: Any) -> Any:
    forward = type(layer).forward  # HF's: in eval mode the layer's own forward, not checkpointed
    if torch.is_grad_enabled() and not layer.training:  # in training mode HF's forward checkpoints itself
        return layer._gradient_checkpointing_func(functools.partial(forward, layer, **kwargs), *args)
    return forward(layer, *args, **kwargs)


def create_optimizer(args: TrainingArguments, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer HF's Trainer builds: ``optim`` and ``optim_args`` through its own helper, weight decay apart.

    ``Trainer.get_optimizer_cls_and_kwargs`` reads ``optim``, ``optim_args``,
    ``learning_rate``, the Adam fields and ``optim_target_modules`` (GaLore,
    APOLLO); ``weight_decay`` applies to every weight but biases and norms
    (``Trainer.get_decay_parameter_names``, which uses no Trainer state).
    """
    for key, refused in PPOSpec.refused_values.items():
        value = getattr(args, key)
        value = getattr(value, "value", value)  # OptimizerNames, SchedulerType
        if value in refused:
            raise ValueError(f"{key}={value!r} is not supported by posttrain's PPO: {refused[value]}")
    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    groups: Any = [
        {"params": [p for name, p in named if name in decay], "weight_decay": args.weight_decay},
        {"params": [p for name, p in named if name not in decay], "weight_decay": 0.0},
    ]
    optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    kwargs = dict(kwargs)
    groups = kwargs.pop("params", groups)  # GaLore, APOLLO: their own groups over optim_target_modules
    return optimizer_cls(groups, **kwargs)


def every(steps: float, max_steps: int) -> int:
    """``logging_steps``, ``save_steps`` in iterations: below 1 a fraction of ``max_steps`` (as HF's); 0 never."""
    if steps <= 0:
        return 0
    return max(1, math.ceil(max_steps * steps)) if steps < 1 else int(steps)
