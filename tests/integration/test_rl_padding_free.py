"""Greedy, transformers' continuous batching (``training.use_transformers_continuous_batching``, GRPO's and RLOO's
switch where vLLM is not used) gives ``generate``'s tokens."""

import torch
from transformers import GenerationConfig
from transformers.generation import ContinuousBatchingConfig

from helpers import PAD, batch, model


def test_continuous_batching_generates_what_generate_does() -> None:
    prompts, prompt_mask, _ = batch("left")
    prompts, prompt_mask = prompts[:, :30], prompt_mask[:, :30]
    settings = GenerationConfig(max_new_tokens=8, do_sample=False, pad_token_id=PAD, eos_token_id=None)
    policy = model("qwen2", "sdpa")
    with torch.no_grad():
        padded = policy.generate(prompts, attention_mask=prompt_mask, generation_config=settings)[:, 30:]
        unpadded = [row[keep.bool()].tolist() for row, keep in zip(prompts, prompt_mask)]
        # a cache for these 6 short rows: sized from the host's memory, it takes ~40 s to fill on CPU
        cache = ContinuousBatchingConfig(num_blocks=8, max_batch_tokens=256)
        outputs = policy.generate_batch(
            unpadded, generation_config=settings, continuous_batching_config=cache, progress_bar=False
        )
    generated = [output.generated_tokens for output in outputs.values()]
    assert generated == padded.tolist()
