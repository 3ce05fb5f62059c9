"""PPO's padding-free passes (entrypoints/trainers/ppo_models.py) compute what its padded passes compute.

For a fixed batch of prompts (left-padded) and responses (ended early, padded
on the right), as PPO's rollout lays them out: the policy's log-probabilities
and entropies of the response tokens, the value model's values, the
reference's log-probabilities, PPO's clipped losses of them and the gradients
of both models, at 1e-5, on Llama, Qwen2 and Qwen3 shapes, with SDPA and with
``torch_varlen`` (on CPU: SDPA one sequence at a time).
"""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from helpers import MODELS, batch, build_trainer, load_template, model, tiny_job
from posttrain.entrypoints.speed import attention, fast_paths
from posttrain.entrypoints.trainers.ppo_math import policy_loss, response_logprobs, value_loss
from posttrain.entrypoints.trainers.ppo_models import PolicyAndValue, causal_lm_logits

TEMPERATURE = 0.7


def value_model(name: str, implementation: str) -> torch.nn.Module:
    """A seeded value model of the policy's architecture and shape."""
    config = model(name, implementation).config
    config.num_labels = 1
    torch.manual_seed(1)
    built = AutoModelForSequenceClassification.from_config(config)
    built.set_attn_implementation(implementation)
    return built.eval()


@pytest.mark.parametrize("padding", ["left", "right", "both"])
@pytest.mark.parametrize("implementation", ["sdpa", attention.NAME])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_padding_free_passes_equal_the_padded_passes(name: str, implementation: str, padding: str) -> None:
    tokens, mask, width = batch(padding)
    prompt_length = tokens.shape[1] - width
    response_mask = mask[:, prompt_length:].float()
    real = response_mask.bool()
    generator = torch.Generator().manual_seed(2)
    old_logprobs = -torch.rand(response_mask.shape, generator=generator) * 5
    old_values, returns, advantages = torch.randn((3, *response_mask.shape), generator=generator)
    results = []
    for padding_free in (False, True):
        models = PolicyAndValue(model(name, implementation), value_model(name, implementation), padding_free)
        logits, values = models(tokens, mask)
        logprobs, entropy = response_logprobs(logits, tokens, prompt_length, TEMPERATURE)
        values = values[:, prompt_length - 1 : -1]
        with torch.no_grad():
            reference = causal_lm_logits(model(name, implementation), tokens, mask, padding_free)
        ref_logprobs, _ = response_logprobs(reference, tokens, prompt_length, TEMPERATURE)
        pg_loss, _ = policy_loss(logprobs, old_logprobs, advantages, response_mask, 0.2)
        vf_loss, _ = value_loss(values, old_values, returns, response_mask, 0.2)
        loss = pg_loss + 0.1 * vf_loss
        loss.backward()
        gradients = {key: parameter.grad for key, parameter in models.named_parameters()}
        results.append((logprobs[real], entropy[real], values[real], ref_logprobs[real], loss, gradients))
    padded, packed = results
    for name_of, expected, got in zip(("logprobs", "entropy", "values", "reference", "loss"), padded, packed):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, msg=name_of)
    for key, gradient in packed[-1].items():
        torch.testing.assert_close(gradient, padded[-1][key], atol=1e-5, rtol=1e-5, msg=key)


def test_the_job_packs_ppos_passes_where_the_attention_is_varlen(tmp_path: Path) -> None:
    """The trainer the entrypoint builds: packed passes with torch_varlen (a GPU's default), padded with SDPA; an
    iteration with packed passes trains, generating with SDPA."""
    trainers = {}
    for implementation, packs in (("sdpa", False), (attention.NAME, True)):
        model_section = {**load_template("ppo/tiny.yaml")["model"], "attn_implementation": implementation}
        job = tiny_job(tmp_path / implementation, "ppo", model=model_section)
        trainers[implementation] = trainer = build_trainer(job)
        assert trainer.padding_free_passes is packs
        assert ("padding_free" in fast_paths.applied(trainer, job.fast_paths)) is packs
        assert (attention.NAME in fast_paths.applied(trainer, job.fast_paths)) is packs
    trainer = trainers[attention.NAME]
    trainer.args.max_steps = 1
    trainer.train()
    policy = trainer.accelerator.unwrap_model(trainer.model).policy
    # back from generating with SDPA
    assert policy.config._attn_implementation == attention.NAME
    assert trainer.state.global_step == 1
