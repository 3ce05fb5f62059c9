"""GRPO's and RLOO's rollouts in transformers without ``generate``'s overheads: the rollout generator.

An RL step samples many completions of very different lengths, and
``generate`` decodes every row of the batch until the longest ends: a row
that wrote its end token at step 10 of 512 still runs through every layer
for 502 more steps, its tokens thrown away as padding. Here a row leaves the
batch, and its KV cache, as it ends: each decode step runs over the rows
still writing (rows leave together, once an eighth of the batch has ended: each
leaving copies the cache). The sampling is ``generate``'s, from the generation config
``generate`` itself would use (the trainer's over the model's): temperature,
then top-k, top-p and min-p (transformers' own warpers, in ``generate``'s
order), softmax and ``torch.multinomial``, or the argmax; the same end tokens,
the same padding after them, the same output. Greedy, it writes what
``generate`` writes, token for token (tests/unit/speed/test_rollout_generator.py).
Sampling, it draws the same tokens for the same seed: each step draws for
every row of the batch as ``generate`` does (torch's draw for one row does
not depend on the others'), where the forward passes ran over the rows left.

A configuration it does not decode (beams, several sequences per prompt, a
repetition penalty, stop strings, any other processor), an encoder-decoder
model, a model with dropout (TRL generates in training mode, and a forward
pass over fewer rows draws other dropout masks), or inputs besides the
prompt's tokens (images) go to ``generate``, as does any run with
``generation.rollout_generator: false``.
"""

import contextlib
import functools
import inspect
from typing import Any, Dict, Iterator, Optional

import torch
from transformers import DynamicCache, GenerationConfig
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

NAME = "rollout_generator"
# the share of the batch (one in this many rows) that must have ended before the ended rows leave it
COMPACT_SHARE = 8
# the config fields of transformers' models that set a dropout rate
DROPOUT_RATES = ("attention_dropout", "hidden_dropout", "dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop")
# what the loop decodes as generate does: the length, the sampling, the end and pad tokens; a key of the generation
# config outside these set to other than its default sends the batch to generate
DECODED = frozenset(
    {
        "max_new_tokens",
        "max_length",
        "do_sample",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "eos_token_id",
        "pad_token_id",
        "bos_token_id",
        "disable_compile",
        "transformers_version",
        "_from_model_config",
    }
)


def unsupported(model: Any, generation_config: GenerationConfig) -> Optional[str]:
    """Why ``model`` with ``generation_config`` (as ``generate`` merges it) goes to ``generate``, or None."""
    if model.config.get_text_config().is_encoder_decoder or getattr(model.config, "is_encoder_decoder", False):
        return "the model is an encoder-decoder"
    dropout = _dropout(model)
    if dropout:
        # TRL generates with the model in training mode: each forward pass draws its dropout for the rows it runs
        # over, so rows leaving the batch would change every draw after (the tokens, from the same distributions)
        return f"a model with dropout ({dropout}), drawn while TRL generates in training mode"
    settings = _set(generation_config)
    if settings.get("repetition_penalty", 1.0) != 1.0:
        return f"repetition_penalty {settings['repetition_penalty']}"
    other = sorted(key for key in settings if key not in DECODED | {"repetition_penalty"})
    if other:
        return "generation settings " + ", ".join(f"{key}={settings[key]!r}" for key in other)
    return None


def _dropout(model: Any) -> str:
    """The model's dropout, where it has some: its config's rates above 0, its dropout modules'."""
    config = model.config.get_text_config()
    rates = {name: getattr(config, name, None) for name in DROPOUT_RATES}
    found = [f"{name} {rate}" for name, rate in rates.items() if isinstance(rate, (int, float)) and rate > 0]
    # LoRA's dropout among them
    if any(isinstance(module, torch.nn.Dropout) and module.p > 0 for module in model.modules()):
        found.append("dropout modules")
    return ", ".join(found)


def _set(config: GenerationConfig) -> Dict[str, Any]:
    """What ``config`` sets to other than ``generate``'s defaults (those it applies where nothing is set)."""
    defaults = GenerationConfig()
    defaults.update(**GenerationConfig._get_default_generation_params())
    default = defaults.to_dict()
    # (an option off, False, is as unset, None)
    return {
        key: value
        for key, value in config.to_dict().items()
        if default.get(key) != value and (value or default.get(key))
    }


@torch.no_grad()
def generate(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, config: GenerationConfig) -> Any:
    """What ``model.generate(input_ids=..., attention_mask=..., generation_config=config)`` returns for a
    left-padded batch: the prompts, then each row's tokens up to its end token, padded to the longest."""
    rows, prompt_length = input_ids.shape
    steps = config.max_new_tokens if config.max_new_tokens is not None else config.max_length - prompt_length
    ends = config.eos_token_id
    ends = torch.tensor([] if ends is None else ends if isinstance(ends, list) else [ends], device=input_ids.device)
    pad = config.pad_token_id if config.pad_token_id is not None else int(ends[0]) if len(ends) else 0
    pick = _sampler(config)
    cache = DynamicCache(config=model.config)
    cached = {_cache_keyword(model): cache}
    # generate's positions: each row's from 0 where its padding ends (a pad's, never attended to, is 1)
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, logits_to_keep=1, **cached
    ).logits[:, -1]
    written = torch.full((rows, max(steps, 0)), pad, dtype=input_ids.dtype, device=input_ids.device)
    # the batch's rows (their places in the output) and which of them have ended
    batch = torch.arange(rows, device=input_ids.device)
    ended = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
    mask, position, longest = attention_mask, positions[:, -1] + 1, 0
    for step in range(steps):
        tokens = pick(logits, batch, rows)
        writing = ~ended
        written[batch[writing], step] = tokens[writing]
        longest = step + 1
        ended |= torch.isin(tokens, ends)
        if step == steps - 1 or ended.all():
            break
        # the rows that ended leave the batch and its cache once they are an eighth of it: each leaving copies the
        # cache, so rows leave together (until then an ended row's tokens are dropped, as generate drops them)
        if ended.sum() * COMPACT_SHARE >= len(ended):
            kept = (~ended).nonzero().squeeze(1)
            cache.batch_select_indices(kept)
            batch, ended, mask, tokens, position = batch[kept], ended[kept], mask[kept], tokens[kept], position[kept]
        mask = torch.cat([mask, mask.new_ones(len(batch), 1)], dim=1)
        step_inputs = {"input_ids": tokens[:, None], "attention_mask": mask, "position_ids": position[:, None]}
        logits = model(**step_inputs, **cached).logits[:, -1]
        position = position + 1
    return torch.cat([input_ids, written[:, :longest]], dim=1)


def _cache_keyword(model: Any) -> str:
    """The name the model's forward takes its KV cache by: ``cache`` since transformers 5.25 (``past_key_values``
    deprecated), ``past_key_values`` before (where ``cache`` would go unread)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _sampler(config: GenerationConfig) -> Any:
    """How a step's tokens are chosen from the batch's last logits, as ``generate`` chooses them."""
    warpers = LogitsProcessorList()
    if config.do_sample:
        if config.temperature is not None and config.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(config.temperature))
        if config.top_k is not None and config.top_k != 0:
            warpers.append(TopKLogitsWarper(top_k=config.top_k, min_tokens_to_keep=1))
        if config.top_p is not None and config.top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=config.top_p, min_tokens_to_keep=1))
        if config.min_p is not None:
            warpers.append(MinPLogitsWarper(min_p=config.min_p, min_tokens_to_keep=1))

    def pick(logits: torch.Tensor, batch: torch.Tensor, rows: int) -> torch.Tensor:
        scores = logits.to(dtype=torch.float32)
        if not config.do_sample:
            return scores.argmax(dim=-1)
        # (these warpers read the scores alone, not the tokens so far)
        probs = torch.softmax(warpers(None, scores), dim=-1)
        if len(batch) < rows:
            # generate draws for every row, ended or not, and torch's draw for one row does not depend on the others'
            # probabilities: drawing for all of them (an ended row's from any distribution) gives each row generate's
            everyone = probs.new_full((rows, probs.shape[-1]), 1.0 / probs.shape[-1])
            everyone[batch] = probs
            return torch.multinomial(everyone, num_samples=1).squeeze(1)[batch]
        return torch.multinomial(probs, num_samples=1).squeeze(1)

    return pick


@contextlib.contextmanager
def generating(model: Any) -> Iterator[None]:
    """``model.generate`` is the rollout generator while inside, for the calls it decodes: a trainer's
    ``generate(input_ids=..., attention_mask=..., generation_config=...)``."""
    original = model.generate

    @functools.wraps(original)
    def rollout(*args: Any, **kwargs: Any) -> Any:
        config = kwargs.get("generation_config")
        inputs = {key: kwargs[key] for key in ("input_ids", "attention_mask") if key in kwargs}
        rest = set(kwargs) - {"input_ids", "attention_mask", "generation_config"}
        if args or rest or len(inputs) < 2 or config is None:
            return original(*args, **kwargs)
        config, _ = model._prepare_generation_config(config)
        if unsupported(model, config) is not None:
            return original(*args, **kwargs)
        return generate(model, inputs["input_ids"], inputs["attention_mask"], config)

    own = vars(model).get("generate")
    model.generate = rollout
    try:
        yield
    finally:
        if own is None:
            del model.generate
        else:
            model.generate = own


def install(trainer: Any) -> Optional[str]:
    """Makes a GRPO or RLOO trainer generate its rollouts with the rollout generator where TRL would call
    ``generate``; returns why not (its generation config, its model), or None."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    config, _ = model._prepare_generation_config(trainer.generation_config)
    why = unsupported(model, config)
    if why is not None:
        return why
    generate_single_turn = trainer._generate_single_turn

    @functools.wraps(generate_single_turn)
    def single_turn(*args: Any, **kwargs: Any) -> Any:
        with generating(trainer.accelerator.unwrap_model(trainer.model)):
            return generate_single_turn(*args, **kwargs)

    trainer._generate_single_turn = single_turn
    setattr(trainer, NAME, True)
    return None
