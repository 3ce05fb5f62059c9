"""Sampling a prompt's completions the same way on any number of processes: one prompt at a time (no padding),
from a seed of the prompt's own, with the spec's settings only."""

from typing import Any, List

import torch

from posttrain.components.spec.schema import GenerationSpec
from posttrain.entrypoints.generation.sampling import prompt_ids, sampling_from_the_logits

# a prompt's seed: the spec's, then its place in the data (each model draws with the same seeds: paired samples)
SEED_STRIDE = 1_000_003


def prompt_seed(generation: GenerationSpec, index: int) -> int:
    return generation.seed * SEED_STRIDE + index


@torch.no_grad()
def sample(model: Any, tokenizer: Any, prompt: Any, generation: GenerationSpec, seed: int) -> List[str]:
    """``generation.num_samples`` completions of ``prompt``, each up to its end token, as text."""
    ids = prompt_ids(tokenizer, prompt)
    input_ids = torch.tensor([ids], device=model.device)
    greedy = generation.temperature == 0
    settings = {"do_sample": False} if greedy else {"do_sample": True, "temperature": generation.temperature}
    if not greedy:
        settings.update(top_p=generation.top_p, top_k=0)
    torch.manual_seed(seed)
    with sampling_from_the_logits(model):
        generated = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=generation.max_new_tokens,
            num_return_sequences=generation.num_samples,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
            use_cache=True,
            **settings,
        )
    ends = model.generation_config.eos_token_id
    ends = set(ends if isinstance(ends, list) else [ends]) | {tokenizer.eos_token_id}
    texts = []
    for completion in generated[:, len(ids) :].tolist():
        cut = next((i for i, token in enumerate(completion) if token in ends), len(completion))
        texts.append(tokenizer.decode(completion[:cut], skip_special_tokens=True))
    return texts
