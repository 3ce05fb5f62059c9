"""Padding-free forward passes for GRPO and RLOO: their training loop on GPUs with varlen attention.

TRL 1.16 scores completions on padded rows: each prompt padded on the left to
the longest prompt, each completion on the right to the longest completion.
Every pad token costs a whole forward and backward (the MLPs, the norms), and
at a realistic step (prompts of a few hundred tokens, completions from a few
tokens to the limit) most of a row can be padding. Here each chunk of rows
TRL forwards is packed into one row, sequence after sequence, positions
restarting at 0; the model's attention keeps the sequences apart (varlen
kernels: ``torch_varlen``, flash attention) and TRL's fused LM head scores the
same completion tokens, whose log-probabilities and entropies go back to
their padded places. The loss TRL computes from them is unchanged: the
padded places are masked there as before (tests/unit/speed/test_rl_padding_free.py
compares log-probabilities, losses and gradients).

Generation needs a KV cache, which the varlen kernels do not take: while the
trainer generates with transformers (``generate`` or continuous batching),
the model attends with SDPA, and with its own implementation again after.
Continuous batching also goes through the model's forward without
accelerate's mixed-precision wrapper, which takes transformers' paged cache
(it has a half-precision ``dtype``) for a tensor to convert to float32 and
fails every request (TRL casts the model to the training dtype for it).
"""

import contextlib
from typing import Any, Dict, Iterator, Optional, Tuple

import torch
import torch.nn.functional as F

from posttrain.entrypoints.speed import attention


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Tuple[Dict[str, torch.Tensor], torch.Tensor]:
    """The rows' real tokens as one row, each sequence's positions from 0 wherever its padding ends
    (``input_ids`` and ``position_ids``, ``[1, tokens]``), and the mask that puts outputs back (:func:`unpack`).
    transformers keeps the sequences apart by their positions only without a KV cache: ``use_cache`` is off."""
    mask = attention_mask.bool()
    positions = mask.cumsum(-1) - 1
    return {"input_ids": input_ids[mask][None], "position_ids": positions[mask][None], "use_cache": False}, mask


def unpack(packed: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A packed row's per-token outputs (``[1, tokens, ...]``) in the padded rows' places, 0 at padding."""
    rows = packed.new_zeros(*mask.shape, *packed.shape[2:])
    rows[mask] = packed[0]
    return rows


def packed_log_probs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    compute_entropy: bool = False,
    compute_aux_loss: bool = False,
) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """What ``model(input_ids, attention_mask, labels, fused_lm_head=True)`` gives TRL for the last
    ``logits_to_keep`` tokens of each row (the completions), computed over the rows' real tokens packed into one
    row: per-token log-probabilities, entropies (or None) and the MoE aux loss (or None), each of the padded
    shape, 0 at padding."""
    inputs, mask = pack(input_ids, attention_mask)
    labels = input_ids.masked_fill(~mask, -100)
    # only the completions are scored
    labels[:, :-logits_to_keep] = -100
    # a row's first token is a prompt's: nothing scores across two sequences
    inputs["labels"] = labels[mask][None]
    if compute_aux_loss:
        inputs["output_router_logits"] = True
    outputs = model(**inputs, fused_lm_head=True)

    def unpacked(per_token: torch.Tensor) -> torch.Tensor:
        # the head's position j predicts packed token j + 1: the first token has no score
        return unpack(F.pad(per_token, (1, 0)), mask)[:, -logits_to_keep:]

    entropies = unpacked(outputs.entropy) if compute_entropy else None
    return unpacked(outputs.log_probs), entropies, outputs.aux_loss if compute_aux_loss else None


@contextlib.contextmanager
def generation_attention(model: Any) -> Iterator[None]:
    """SDPA while ``model`` generates, where its own attention is ``torch_varlen`` (which takes no KV cache)."""
    # PEFT: what it wraps
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    implementation = model.config._attn_implementation
    if implementation != attention.NAME:
        yield
        return
    model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        model.set_attn_implementation(implementation)


@contextlib.contextmanager
def forward_without_float32_outputs(model: Any) -> Iterator[None]:
    """``model``'s forward as it was before accelerate wrapped it in mixed precision (autocast, outputs converted
    to float32), where it did."""
    wrapped, original = model.__dict__.get("forward"), getattr(model, "_original_forward", None)
    if wrapped is None or original is None:
        yield
        return
    model.forward = original
    try:
        yield
    finally:
        model.forward = wrapped


def pack_passes(trainer: Any) -> None:
    """Makes a GRPO or RLOO trainer's forward passes padding-free (``padding_free_passes`` says so): text rows
    only; rows with images go through TRL's padded passes."""
    padded = trainer._get_per_token_logps_and_entropies

    def passes(
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: Optional[int] = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **multimodal: Any,
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        if any(value is not None for value in multimodal.values()):
            return padded(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=batch_size,
                compute_entropy=compute_entropy,
                compute_aux_loss=compute_aux_loss,
                **multimodal,
            )
        # TRL's chunks of rows, each packed
        batch_size = batch_size or input_ids.size(0)
        chunks = []
        for start in range(0, input_ids.size(0), batch_size):
            with trainer.accelerator.autocast():
                chunks.append(
                    packed_log_probs(
                        model,
                        input_ids[start : start + batch_size],
                        attention_mask[start : start + batch_size],
                        logits_to_keep,
                        compute_entropy,
                        compute_aux_loss,
                    )
                )
        logps, entropies, aux_losses = zip(*chunks)
        return (
            torch.cat(logps),
            torch.cat(entropies) if compute_entropy else None,
            torch.stack(aux_losses).mean() if compute_aux_loss else None,
        )

    trainer._get_per_token_logps_and_entropies = passes
    trainer.padding_free_passes = True


def generate_with_a_kv_cache(trainer: Any) -> None:
    """Makes a GRPO or RLOO trainer generate with SDPA where its model trains with ``torch_varlen``, and its
    continuous batching go through the forward accelerate wrapped in mixed precision."""
    generate = trainer._generate_single_turn

    def generate_single_turn(*args: Any, **kwargs: Any) -> Any:
        model = trainer.accelerator.unwrap_model(trainer.model)
        paged = trainer.use_transformers_continuous_batching and not trainer.use_vllm
        with generation_attention(model), forward_without_float32_outputs(model) if paged else contextlib.nullcontext():
            return generate(*args, **kwargs)

    trainer._generate_single_turn = generate_single_turn
