"""GRPO's and RLOO's padding-free forward passes compute what TRL's padded ones compute.

For a fixed batch of prompts and completions (prompts of very different
lengths padded on the left as TRL pads them, completions ended early and
padded on the right), the per-token log-probabilities and entropies of the
completions, a GRPO loss of them and its gradients equal those of TRL's own
``_get_per_token_logps_and_entropies`` (its code, unchanged) at 1e-5, on
Llama, Qwen2 and Qwen3 shapes, with SDPA and with ``torch_varlen`` (on CPU:
SDPA one sequence at a time). Generation then attends with SDPA and goes back.
"""

from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from transformers import GenerationConfig
from trl import GRPOTrainer

from helpers import MODELS, PAD, batch, build_trainer, model, tiny_job
from posttrain.entrypoints.inputs import tiny
from posttrain.entrypoints.speed import attention, fast_paths
from posttrain.entrypoints.speed.rl_padding_free import (
    forward_without_float32_outputs,
    generation_attention,
    pack_passes,
)


class Padded:
    """TRL's padded passes, its own code: what the trainer calls them with is all that is stood in for."""

    @property
    def accelerator(self) -> Accelerator:
        return Accelerator(cpu=True)

    _get_per_token_logps_and_entropies = GRPOTrainer._get_per_token_logps_and_entropies


def packed() -> Padded:
    trainer = Padded()
    pack_passes(trainer)
    return trainer


def grpo_loss(logps: torch.Tensor, entropies: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """A policy-gradient loss of the completions' tokens (advantages of either sign) with an entropy bonus."""
    advantages = torch.tensor([1.0, -0.5, 0.25, -1.0, 2.0, 0.5])[:, None]
    per_token = -torch.exp(logps - logps.detach()) * advantages - 0.01 * entropies
    return (per_token * completion_mask).sum() / completion_mask.sum()


@pytest.mark.parametrize("padding", ["left", "right", "both"])
@pytest.mark.parametrize("implementation", ["sdpa", attention.NAME])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_padding_free_passes_equal_trl_padded_passes(name: str, implementation: str, padding: str) -> None:
    ids, mask, width = batch(padding)
    completion_mask = mask[:, -width:].float()
    results = []
    for trainer in (Padded(), packed()):
        policy = model(name, implementation)
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
            policy, ids, mask, width, batch_size=4, compute_entropy=True
        )
        loss = grpo_loss(logps, entropies, completion_mask)
        loss.backward()
        gradients = {key: parameter.grad for key, parameter in policy.named_parameters()}
        results.append((logps, entropies, loss, gradients))
    (padded_logps, padded_entropies, padded_loss, padded_grads), (logps, entropies, loss, grads) = results
    assert logps.shape == padded_logps.shape == (6, width)
    assert (logps[completion_mask == 0] == 0).all() and (entropies[completion_mask == 0] == 0).all()
    torch.testing.assert_close(logps, padded_logps, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropies, padded_entropies, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, padded_loss, atol=1e-5, rtol=1e-5)
    for key, gradient in grads.items():
        torch.testing.assert_close(gradient, padded_grads[key], atol=1e-5, rtol=1e-5, msg=key)


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_the_job_packs_the_passes_where_the_attention_is_varlen(tmp_path: Path, algorithm: str) -> None:
    """The trainer the entrypoint builds, as the job has it built: packed passes with torch_varlen (what a GPU takes
    by default), TRL's padded ones with SDPA (the default elsewhere); generation adapted in both."""
    for implementation, packs in ((attention.NAME, True), ("sdpa", False)):
        model_section = {"name_or_path": tiny.NAME, "attn_implementation": implementation}
        job = tiny_job(tmp_path / implementation, algorithm, model=model_section)
        trainer = build_trainer(job)
        assert getattr(trainer, "padding_free_passes", False) is packs
        assert ("padding_free" in fast_paths.applied(trainer, job.fast_paths)) is packs
        # SDPA while generating, wherever the model trains varlen
        assert "_generate_single_turn" in vars(trainer)


def test_generation_attends_with_sdpa_and_goes_back() -> None:
    """torch_varlen takes no KV cache: generating switches the model to SDPA (the same greedy tokens as a model
    loaded with SDPA) and back to torch_varlen after."""
    prompts, prompt_mask, _ = batch("left")
    prompts, prompt_mask = prompts[:, :30], prompt_mask[:, :30]
    settings = GenerationConfig(max_new_tokens=8, do_sample=False, pad_token_id=PAD, eos_token_id=None)
    with torch.no_grad():
        expected = model("llama", "sdpa").generate(prompts, attention_mask=prompt_mask, generation_config=settings)
        varlen = model("llama", attention.NAME)
        with generation_attention(varlen):
            assert varlen.config._attn_implementation == "sdpa"
            generated = varlen.generate(prompts, attention_mask=prompt_mask, generation_config=settings)
    assert varlen.config._attn_implementation == attention.NAME
    assert torch.equal(generated, expected)


def test_continuous_batching_runs_the_forward_accelerate_wrapped() -> None:
    """accelerate's mixed-precision forward converts half-precision outputs (and the paged cache, which has a dtype)
    to float32: continuous batching gets the forward it wrapped, and the wrapper is back after."""
    # the process's state: mixed precision or not
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        policy = Accelerator(cpu=True, mixed_precision="bf16").prepare(model("qwen2", "sdpa"))
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    wrapped = policy.forward
    with forward_without_float32_outputs(policy):
        assert policy.forward == policy._original_forward != wrapped
    assert policy.forward == wrapped
    plain = model("qwen2", "sdpa")
    # never wrapped: unchanged
    with forward_without_float32_outputs(plain):
        # TRL's fused LM head
        assert "forward" in plain.__dict__
