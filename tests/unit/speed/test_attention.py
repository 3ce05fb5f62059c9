"""torch_varlen attention: each sequence of a packed row gets exactly the attention it gets alone.

On CPU the boundaries go to SDPA one sequence at a time; on a GPU to torch's
varlen kernels (the ``gpu`` test). Both are checked against transformers' SDPA
on the same sequences unpacked: losses and gradients.
"""

from pathlib import Path
from typing import Dict, List

import pytest
import torch
from transformers import (
    Gemma2Config,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PretrainedConfig,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.job import spec_parts
from posttrain.entrypoints.speed import attention, fast_paths

SHAPE = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, max_position_embeddings=256)
# a long tail, as instruction data has
LENGTHS = [3, 41, 7, 19, 64, 12]


def build(family: str, implementation: str, device: str = "cpu", dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    attention.register()
    torch.manual_seed(0)
    # grouped KV, as real models have
    heads = dict(num_attention_heads=4, num_key_value_heads=2)
    config = {
        "llama": lambda: LlamaConfig(**SHAPE, **heads),
        "qwen2": lambda: Qwen2Config(**SHAPE, **heads),
        # norms of queries and keys
        "qwen3": lambda: Qwen3Config(**SHAPE, **heads, head_dim=16),
        # windows shorter than most rows
        "mistral": lambda: MistralConfig(**SHAPE, **heads, sliding_window=8),
    }[family]()
    model_class = {
        "llama": LlamaForCausalLM,
        "qwen2": Qwen2ForCausalLM,
        "qwen3": Qwen3ForCausalLM,
        "mistral": MistralForCausalLM,
    }[family]
    return model_class._from_config(config, attn_implementation=implementation).to(device, dtype)


def sequences(device: str = "cpu") -> List[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(1, 300, (n,), generator=generator).to(device) for n in LENGTHS]


def packed(rows: List[torch.Tensor]) -> Dict[str, torch.Tensor]:
    """One row, positions restarting at 0: TRL's padding-free batch."""
    positions = torch.cat([torch.arange(len(row), device=row.device) for row in rows])[None]
    return {"input_ids": torch.cat(rows)[None], "position_ids": positions}


def padded(rows: List[torch.Tensor], side: str = "right") -> Dict[str, torch.Tensor]:
    longest = max(len(row) for row in rows)
    ids, mask = [], []
    for row in rows:
        fill = row.new_zeros(longest - len(row))
        ids.append(torch.cat([row, fill] if side == "right" else [fill, row]))
        ones, zeros = torch.ones_like(row), torch.zeros_like(fill)
        mask.append(torch.cat([ones, zeros] if side == "right" else [zeros, ones]))
    return {"input_ids": torch.stack(ids), "attention_mask": torch.stack(mask)}


def token_losses(model: torch.nn.Module, batch: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
    """Each sequence's per-token losses, in order, from a packed or a padded batch."""
    logits = model(**batch, use_cache=False).logits.float()
    if "position_ids" in batch:
        starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist() + [logits.shape[1]]
        spans = [(0, a, b) for a, b in zip(starts, starts[1:])]
    else:
        mask = batch["attention_mask"]
        spans = [(i, int(mask[i].nonzero()[0]), int(mask[i].nonzero()[-1]) + 1) for i in range(len(mask))]
    ids = batch["input_ids"]
    return [
        torch.nn.functional.cross_entropy(logits[i, a : b - 1], ids[i, a + 1 : b], reduction="none")
        for i, a, b in spans
    ]


def losses_and_gradients(model: torch.nn.Module, batch: Dict[str, torch.Tensor]):
    """Each sequence's token losses, and the gradients of their mean over all tokens."""
    model.zero_grad()
    losses = token_losses(model, batch)
    torch.cat(losses).mean().backward()
    return [loss.detach() for loss in losses], {name: p.grad.clone() for name, p in model.named_parameters()}


def apart(model: torch.nn.Module, rows: List[torch.Tensor]):
    """What ``losses_and_gradients`` gives where each sequence runs alone: no packing, no padding."""
    model.zero_grad()
    tokens = sum(len(row) - 1 for row in rows)
    losses = []
    for row in rows:
        (loss,) = token_losses(model, {"input_ids": row[None], "attention_mask": torch.ones_like(row)[None]})
        (loss.sum() / tokens).backward()
        losses.append(loss.detach())
    return losses, {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_a_packed_row_trains_as_its_sequences_apart(family: str) -> None:
    rows = sequences()
    alone, expected_grads = apart(build(family, "sdpa"), rows)
    varlen = build(family, attention.NAME)
    for batch in (packed(rows), padded(rows), padded(rows, side="left")):
        losses, grads = losses_and_gradients(varlen, batch)
        for got, want in zip(losses, alone):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_rows_without_padding_stay_apart() -> None:
    # each row full: transformers sends no mask
    rows = [row[:7] for row in sequences() if len(row) >= 7]
    alone, expected_grads = apart(build("qwen2", "sdpa"), rows)
    losses, grads = losses_and_gradients(build("qwen2", attention.NAME), padded(rows))
    for got, want in zip(losses, alone):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_check_can_fail_a_row_whose_positions_run_on_is_one_sequence() -> None:
    rows, varlen = sequences(), build("qwen2", attention.NAME)
    alone = token_losses(varlen, packed(rows[1:2]))[0]
    joined = torch.cat(rows)[None]
    positions = torch.arange(joined.shape[1])[None]
    second = token_losses(varlen, {"input_ids": joined, "position_ids": positions})[0][len(rows[0]) :][: len(alone) - 1]
    # the second sequence saw the first
    assert (second - alone[1:]).abs().max() > 1e-3


def test_generating_with_a_kv_cache_is_refused_in_one_line() -> None:
    model = build("llama", attention.NAME)
    with pytest.raises(NotImplementedError, match="torch_varlen attention runs causal self-attention over whole"):
        model.generate(sequences()[0][None], max_new_tokens=2, do_sample=False)


def test_a_generating_algorithm_is_refused_it_before_the_job_unless_it_generates_with_sdpa() -> None:
    spec = {"model": {"name_or_path": "builtin:tiny-llama", "attn_implementation": "torch_varlen"}}
    spec.update(
        data={"train": {"path": "rows.jsonl"}},
        training={"output_dir": "out"},
        rewards=[{"builtin": "contains", "args": {"target": "blue"}}],
    )
    with pytest.raises(SpecError, match="torch_varlen trains on whole sequences and cannot generate"):
        validate({"algorithm": "online_dpo", **spec})
    # their passes are padding-free, their generation SDPA's (rl_padding_free.py)
    for algorithm in ("grpo", "rloo"):
        assert validate({"algorithm": algorithm, **spec}).model.attn_implementation == "torch_varlen"


def sft_spec(tmp_path: Path, config: PretrainedConfig, model: Dict[str, object] = {}, **training: object):
    config.save_pretrained(tmp_path / config.model_type)
    spec = {"model": {"name_or_path": str(tmp_path / config.model_type), **model}, "data": {"train": {"path": "x"}}}
    return validate({"algorithm": "sft", **spec, "training": {"output_dir": "out", **training}})


def test_on_a_gpu_with_varlen_kernels_sft_takes_torch_varlen_for_the_models_it_is_checked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(attention, "varlen_available", lambda: None)
    qwen = Qwen2Config(**SHAPE, num_attention_heads=4, num_key_value_heads=2)
    assert fast_paths.attention_implementation(spec_parts.parts(sft_spec(tmp_path, qwen)).fast_paths) == "torch_varlen"
    chosen = sft_spec(tmp_path, qwen, model={"attn_implementation": "sdpa"})
    assert fast_paths.attention_implementation(spec_parts.parts(chosen).fast_paths) == "sdpa"
    assert (
        fast_paths.attention_implementation(spec_parts.parts(sft_spec(tmp_path, qwen, padding_free=False)).fast_paths)
        is None
    )
    assert (
        fast_paths.attention_implementation(spec_parts.parts(sft_spec(tmp_path, qwen, bf16=False)).fast_paths) is None
        # float32: no kernel
    )
    dropout = Qwen2Config(**SHAPE, num_attention_heads=4, attention_dropout=0.1)
    dropout.model_type = "qwen2"
    assert (
        fast_paths.attention_implementation(spec_parts.parts(sft_spec(tmp_path / "dropout", dropout)).fast_paths)
        is None
    )
    assert (
        fast_paths.attention_implementation(spec_parts.parts(sft_spec(tmp_path, Gemma2Config(**SHAPE))).fast_paths)
        is None
        # softcapping
    )
    monkeypatch.setattr(attention, "varlen_available", lambda: "no CUDA device")
    assert fast_paths.attention_implementation(spec_parts.parts(sft_spec(tmp_path, qwen)).fast_paths) is None


def test_without_a_gpu_that_runs_the_kernels_torch_varlen_is_no_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "Tesla V100-SXM2-16GB")
    assert attention.varlen_available() == (
        "torch's varlen kernels need a GPU of compute capability 8.0 or later (A100, H100); Tesla V100-SXM2-16GB is "
        "older"
    )
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert "AMD" in attention.varlen_available()


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_on_a_gpu_torch_varlen_kernels_match_sdpa(family: str) -> None:
    assert attention.varlen_available() is None
    rows = sequences("cuda")
    # each sequence alone: SDPA's padded batches with a sliding window have rows that see nothing, NaN gradients
    expected_losses, expected_grads = apart(build(family, "sdpa", "cuda", torch.bfloat16), rows)
    varlen = build(family, attention.NAME, "cuda", torch.bfloat16)
    for batch in (packed(rows), padded(rows, side="left")):
        losses, grads = losses_and_gradients(varlen, batch)
        for got, want in zip(losses, expected_losses):
            torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        for name, grad in grads.items():
            assert (grad.float() - expected_grads[name].float()).norm() <= 2e-2 * expected_grads[name].float().norm(), (
                name
            )
