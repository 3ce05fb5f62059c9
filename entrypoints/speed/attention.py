"""``torch_varlen``: attention that keeps packed sequences apart, with the kernels torch ships.

flash-attn's varlen kernels are what makes padding-free rows pay on GPUs
(no padding, no dense mask over the whole row), but flash-attn is a CUDA
build rarely installed. torch >= 2.11 ships the same kernels as
``torch.nn.attention.varlen.varlen_attn``; this module registers them with
transformers under the name ``torch_varlen`` (``model.attn_implementation``),
so any transformers model whose attention goes through transformers'
attention interface can use them.

A row's sequences are where its positions restart at 0, or TRL's collator's
``cu_seq_lens_q`` where it sends them; a padded batch's are its attention
mask's. Off CUDA (the CPU tests) the same boundaries go to SDPA one sequence
at a time: slow, and exactly the attention each sequence gets alone.
"""

import functools
import inspect
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F

from posttrain.components.spec.schema import TORCH_VARLEN as NAME


def varlen_available() -> Optional[str]:
    """Why ``torch_varlen`` cannot run on this machine's GPU; None where it can."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.version.hip is not None:
        return "torch's varlen kernels are CUDA's; this GPU is AMD's (ROCm)"
    if torch.cuda.get_device_capability() < (8, 0):
        name = torch.cuda.get_device_name()
        return f"torch's varlen kernels need a GPU of compute capability 8.0 or later (A100, H100); {name} is older"
    try:
        parameters = _kernel_parameters()
    except ImportError:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen (torch >= 2.11 has)"
    if "window_size" not in parameters:
        return f"torch {torch.__version__}'s varlen_attn takes no window_size (torch >= 2.11 does)"
    return None


@functools.lru_cache(maxsize=1)
def _kernel_parameters() -> frozenset:
    from torch.nn.attention.varlen import varlen_attn

    return frozenset(inspect.signature(varlen_attn).parameters)


def register() -> None:
    """Makes ``torch_varlen`` an attention implementation transformers' models accept."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(NAME, varlen_attention)
    # a padded batch's 2D mask reaches the attention as it is, as with flash attention; packed rows get none
    AttentionMaskInterface.register(NAME, flash_attention_mask)


def sequence_bounds(
    position_ids: Optional[torch.Tensor],
    cu_seq_lens: Optional[torch.Tensor],
    max_length: Optional[int],
    batch: int,
    length: int,
    device: torch.device,
) -> Tuple[torch.Tensor, int]:
    """Where each sequence of the flattened batch starts (and the end), and the longest sequence's length: TRL's
    boundaries where it sends them, else wherever a row starts or its positions restart at 0."""
    if cu_seq_lens is not None and max_length is not None:
        return cu_seq_lens.to(device=device, dtype=torch.int32), int(max_length)
    starts = torch.arange(batch * length, device=device) % length == 0
    # transformers' own are one row for the batch: (1, length)
    if position_ids is not None:
        starts |= position_ids.to(device).expand(batch, length).reshape(-1) == 0
    bounds = F.pad(starts.nonzero().reshape(-1), (0, 1), value=batch * length).to(torch.int32)
    return bounds, int(bounds.diff().max())


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    scaling: Optional[float] = None,
    dropout: float = 0.0,
    sliding_window: Optional[int] = None,
    position_ids: Optional[torch.Tensor] = None,
    cu_seq_lens_q: Optional[torch.Tensor] = None,
    max_length_q: Optional[int] = None,
    is_causal: Optional[bool] = None,
    softcap: Optional[float] = None,
    s_aux: Optional[torch.Tensor] = None,
    **_: Any,
) -> Tuple[torch.Tensor, None]:
    """transformers' attention interface: (batch, heads, tokens, dim) in, (batch, tokens, heads, dim) out."""
    batch, heads, length, dim = query.shape
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    if dropout or softcap or s_aux is not None or not causal or key.shape[2] != length or value.shape[-1] != dim:
        raise NotImplementedError(
            f"{NAME} attention runs causal self-attention over whole sequences (no KV cache), one head size, "
            "without dropout, softcapping or sinks; set model.attn_implementation to sdpa"
        )
    # (batch, heads, tokens, dim) -> (tokens of the whole batch, heads, dim)
    q, k, v = (x.transpose(1, 2).reshape(batch * length, x.shape[1], dim) for x in (query, key, value))
    kept = None
    # a padded batch: its real tokens, one sequence per row
    if attention_mask is not None:
        kept = attention_mask.reshape(-1).nonzero().reshape(-1)
        q, k, v = q[kept], k[kept], v[kept]
        lengths = attention_mask.sum(-1, dtype=torch.int32)
        bounds = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
        longest = int(lengths.max())
    else:
        bounds, longest = sequence_bounds(position_ids, cu_seq_lens_q, max_length_q, batch, length, q.device)
    if q.is_cuda:
        out = _varlen_kernel(q, k, v, bounds, longest, scaling, sliding_window)
    else:
        out = _attention_per_sequence(q, k, v, bounds.tolist(), scaling, sliding_window)
    if kept is not None:
        out = out.new_zeros(batch * length, heads, dim).index_copy(0, kept, out)
    return out.reshape(batch, length, heads, dim), None


def _varlen_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bounds: torch.Tensor,
    longest: int,
    scaling: Optional[float],
    window: Optional[int],
) -> torch.Tensor:
    """torch's varlen kernels: (tokens, heads, dim) in and out, in the autocast dtype where autocast is on (the
    kernels are not autocast's: RoPE may have left queries and keys in float32 and values in bf16)."""
    from torch.nn.attention.varlen import varlen_attn

    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else v.dtype
    if dtype not in (torch.bfloat16, torch.float16):
        raise NotImplementedError(
            f"{NAME} attention's kernels take bfloat16 or float16, and this model computes in {dtype}: train with "
            "training.bf16: true, or set model.attn_implementation to sdpa"
        )
    q, k, v = (x.to(dtype) for x in (q, k, v))
    heads, grouped = q.shape[1], {}
    if k.shape[1] != heads and "enable_gqa" in _kernel_parameters():
        grouped = {"enable_gqa": True}
    elif k.shape[1] != heads:
        # torch 2.11's kernels want a key and value head for each query head
        k, v = (x.repeat_interleave(heads // x.shape[1], dim=1) for x in (k, v))
    window_size = (-1, 0) if window is None else (window - 1, 0)
    return varlen_attn(q, k, v, bounds, bounds, longest, longest, scale=scaling, window_size=window_size, **grouped)


def _attention_per_sequence(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list, scaling: Optional[float], window: Optional[int]
) -> torch.Tensor:
    """Each sequence's causal attention on its own, with SDPA: (tokens, heads, dim) in and out."""
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (x[start:end].transpose(0, 1) for x in (q, k, v))
        mask = torch.ones(end - start, end - start, dtype=torch.bool, device=q.device).tril()
        if window is not None:
            mask = mask.triu(1 - window)
        out = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=mask, scale=scaling, enable_gqa=ks.shape[0] != qs.shape[0]
        )
        outs.append(out.transpose(0, 1))
    return torch.cat(outs)
