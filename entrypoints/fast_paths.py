"""Fast paths, on by default where they compute what TRL's defaults compute, only faster.

Which algorithm takes which is its spec class's ``fast_paths`` (the
registry). A key the user set is never changed: setting it, to either value,
is the off-switch. ``run_summary.json`` lists what ran (``fast_paths``).
Measured gains: BENCHMARKS.md.

- ``padding_free`` (SFT): each batch is one row, its sequences one after
  another with positions restarting at 0, and no padding at all; TRL's
  default pads every row to the batch's longest. Per-sequence losses are
  those of the padded batch (tests/unit/test_fast_paths.py) because the mask
  transformers builds from the positions keeps each sequence to itself. That
  holds for transformers' own models with a mask-aware attention
  implementation; for any other model the path stays off and the job says
  why. On by default on CPUs, and on GPUs with flash attention; with SDPA
  on GPUs it is slower (a dense mask over the whole row), so it stays off
  there. Off-switch: ``training.padding_free: false``. (``packing`` is not a
  default: it changes how many sequences a step trains on.)
- ``use_liger_kernel`` (SFT, on CUDA, when ``liger-kernel`` is installed):
  Liger's fused kernels (RMSNorm, RoPE, SwiGLU, a cross-entropy that never
  materialises the logits). Off-switch: ``training.use_liger_kernel: false``.
- no activation checkpointing (SFT, on CPU): TRL turns it on to save GPU
  memory, and the backward then runs every layer's forward again; the same
  gradients without that, for more memory (activations are kept). Measured
  for SFT only: DPO and GRPO did not gain. Off-switch:
  ``training.activation_checkpointing: true``.
"""

import importlib.util
import logging
from typing import Any, Dict, List, Optional

import torch

from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.schema import (
    CHECKPOINTING_OPTIONS,
    CHECKPOINTING_SWITCHES,
    PACKING_AWARE_ATTENTION,
    Spec,
)

log = logging.getLogger("posttrain")

# Kernels that attend within each sequence of the row (varlen): the only ones where padding-free pays on GPUs.
# With the others the row gets a dense mask over all of it, which cost 2x on an H100 (BENCHMARKS.md).
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")
# the keys, old names and new, that turn activation checkpointing on or off or configure it
CHECKPOINTING_KEYS = {*CHECKPOINTING_SWITCHES, *CHECKPOINTING_OPTIONS}


def config_defaults(spec: Spec, on_cuda: bool) -> Dict[str, Any]:
    """The fast paths set in the TRL config: keyword arguments the user left unset."""
    defaults: Dict[str, Any] = {}
    if "use_liger_kernel" in spec.fast_paths and "use_liger_kernel" not in spec.training:
        if on_cuda and importlib.util.find_spec("liger_kernel") is not None:
            defaults["use_liger_kernel"] = True
    checkpointing_set = CHECKPOINTING_KEYS & set(spec.training)  # its options too: the user wants it
    if "no_activation_checkpointing" in spec.fast_paths and not on_cuda and not checkpointing_set:
        defaults["activation_checkpointing"] = False
    return defaults


def padding_free_reason(model: Any) -> Optional[str]:
    """Why packed sequences could see each other in ``model``'s attention; None where they cannot."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model: what it wraps
    module = type(model).__module__
    if not module.startswith("transformers.models."):
        return f"{type(model).__name__} comes from {module}, not transformers' own models"
    implementation = model.config._attn_implementation
    if implementation not in PACKING_AWARE_ATTENTION:
        return f"attn_implementation {implementation!r} is not one of {', '.join(PACKING_AWARE_ATTENTION)}"
    return None


def switch_to_padding_free(trainer: Any, spec: Spec) -> None:
    """Turns TRL's collator padding-free where the spec leaves it to us and the model keeps sequences apart.

    After the trainer is built: TRL 1.16 refuses ``padding_free`` with a
    ``max_length`` ("not enforced"), yet its dataset preparation truncates to
    ``max_length`` before any batch is made (``SFTTrainer._prepare_dataset``),
    so the collator is all that changes. Where the user asked for packing or
    padding-free batches and the model could let sequences see each other,
    the job stops and says why.
    """
    collator, training = getattr(trainer, "data_collator", None), spec.training
    if "padding_free" not in spec.fast_paths or not hasattr(collator, "padding_free"):
        return
    model = trainer.accelerator.unwrap_model(trainer.model)
    reason = padding_free_reason(model)
    if collator.padding_free:  # the user's packing or padding_free
        if reason is not None:
            key = "packing" if training.get("packing") else "padding_free"
            raise SpecError([f"training.{key}: packed sequences could attend to each other: {reason}; set it to false"])
        return
    if "padding_free" in training or getattr(trainer, "_is_vision_dataset", False):
        return
    implementation = model.config._attn_implementation
    if reason is None and torch.cuda.is_available() and implementation not in VARLEN_ATTENTION:
        reason = f"on GPUs, {implementation} attention over one long row is slower than padding (BENCHMARKS.md)"
    if reason is not None:
        log.info("padding-free batches stay off: %s", reason)
        return
    collator.padding_free = trainer.padding_free = True


def applied(trainer: Any) -> List[str]:
    """The fast paths the live trainer runs with."""
    found = []
    if getattr(getattr(trainer, "data_collator", None), "padding_free", False):
        found.append("padding_free")
    if getattr(trainer.args, "use_liger_kernel", False):
        found.append("use_liger_kernel")
    fsdp_checkpointing = (getattr(trainer.args, "fsdp_config", None) or {}).get("activation_checkpointing")
    if getattr(trainer.args, "activation_checkpointing", None) is False and not fsdp_checkpointing:
        found.append("no_activation_checkpointing")
    return found
