"""The rollout generator writes what ``generate`` writes (entrypoints/speed/rollout_generator.py).

Left-padded prompts of different lengths (the tiny model's own tokenizer, Mistral's real ones and a real chat
template), rows ending at different steps (end tokens chosen from what the rows write), ended rows leaving the batch
at once or kept in it a while: greedy, the output equals ``generate``'s token for token, on Llama, Qwen2 and Qwen3
shapes; sampling (temperature, top-k, top-p, min-p), the same tokens for the same seed. What the loop
does not decode goes to ``generate``; a GRPO trainer's rollouts come from it and its training goes on.
"""

import dataclasses
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch
from transformers import AutoTokenizer, GenerationConfig, MistralForCausalLM

from helpers import MODELS, build_trainer, load_template, model, tiny_job
from posttrain.entrypoints.inputs import tiny
from posttrain.entrypoints.speed import rollout_generator

PROMPTS = [
    "What is 2 plus 3?",
    "Name a colour.",
    "Write the first three letters of the alphabet, then stop, and say nothing else at all.",
    "Hi",
    "Which is larger, 7 or 9? Answer with the number alone.",
    "Say yes.",
]


def left_padded(tokenizer: Any, prompts: List[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return batch["input_ids"], batch["attention_mask"]


def ending_config(model: Any, ids: torch.Tensor, mask: torch.Tensor, **settings: Any) -> GenerationConfig:
    """A config whose end tokens the rows write at different steps: tokens ``generate`` wrote at steps 2, 5 and 9
    of rows 0, 1 and 2 when nothing ended them (greedy, so the free run is the run's prefix)."""
    free = GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    written = model.generate(input_ids=ids, attention_mask=mask, generation_config=free)[:, ids.shape[1] :]
    ends = sorted({int(written[0, 2]), int(written[1, 5]), int(written[2, 9])})
    return GenerationConfig(max_new_tokens=24, eos_token_id=ends, pad_token_id=0, **settings)


def ended_at(written: torch.Tensor, ends: List[int]) -> List[int]:
    """The step each row ended at (its first end token), or its length."""
    hits = torch.isin(written, torch.tensor(ends))
    return [int(row.nonzero()[0]) if row.any() else len(row) for row in hits]


def assert_greedy_equal(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> None:
    config = ending_config(model, ids, mask, do_sample=False)
    expected = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    got = rollout_generator.generate(model, ids, mask, model._prepare_generation_config(config)[0])
    assert torch.equal(got, expected)
    # rows ended at different steps, and one ran to the end: rows left the batch while others wrote on
    steps = ended_at(expected[:, ids.shape[1] :], config.eos_token_id)
    assert len(set(steps)) >= 3, steps


@pytest.mark.parametrize("share", [rollout_generator.COMPACT_SHARE, 2])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_greedy_writes_what_generate_writes_token_for_token(
    name: str, share: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # with 2, ended rows stay in the batch (their tokens dropped) until half of it has ended
    monkeypatch.setattr(rollout_generator, "COMPACT_SHARE", share)
    tokenizer = tiny.build_tokenizer()
    built = model(name, "sdpa")
    built.config.vocab_size = built.get_output_embeddings().weight.shape[0]
    ids, mask = left_padded(tokenizer, PROMPTS)
    assert_greedy_equal(built.eval(), ids % built.config.vocab_size, mask)


@pytest.mark.parametrize("name", ["tekken", "sentencepiece"])
def test_greedy_equals_generate_with_mistral_s_tokenizers(mistral_models: Dict[str, Path], name: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(mistral_models[name])
    torch.manual_seed(0)
    built = MistralForCausalLM.from_pretrained(mistral_models[name]).eval()
    ids, mask = left_padded(tokenizer, PROMPTS)
    assert_greedy_equal(built, ids, mask)


def test_greedy_equals_generate_on_chat_prompts_of_the_tools_model(tools_tokenizer: Any) -> None:
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    built = tiny.build_model_tools(tiny.build_tokenizer_tools(), LlamaForCausalLM).eval()
    chats = [tools_tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False) for p in PROMPTS]
    ids, mask = left_padded(tools_tokenizer, chats)
    assert_greedy_equal(built, ids, mask)


def sampled(built: Any, ids: torch.Tensor, mask: torch.Tensor, config: GenerationConfig, seed: int) -> Tuple:
    torch.manual_seed(seed)
    expected = built.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    torch.manual_seed(seed)
    got = rollout_generator.generate(built, ids, mask, built._prepare_generation_config(config)[0])
    return expected[:, ids.shape[1] :], got[:, ids.shape[1] :]


@pytest.mark.parametrize("share", [rollout_generator.COMPACT_SHARE, 2])
def test_sampling_draws_generate_s_tokens_for_the_same_seed(share: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rollout_generator, "COMPACT_SHARE", share)
    tokenizer = tiny.build_tokenizer()
    built = model("llama", "sdpa").eval()
    ids, mask = left_padded(tokenizer, PROMPTS * 2)
    ids = ids % built.config.vocab_size
    # the end tokens: the likeliest first tokens of three prompts, so rows end from the first step on
    likeliest = built(input_ids=ids[:3], attention_mask=mask[:3]).logits[:, -1].topk(2).indices
    ends = sorted({int(likeliest[0, 0]), int(likeliest[1, 1]), int(likeliest[2, 0])})
    settings = {"do_sample": True, "temperature": 0.8, "top_k": 6, "top_p": 0.9, "min_p": 0.01}
    config = GenerationConfig(max_new_tokens=16, eos_token_id=ends, pad_token_id=0, **settings)
    lengths = set()
    for seed in range(6):
        expected, got = sampled(built, ids, mask, config, seed)
        assert torch.equal(got, expected), seed
        lengths |= set(ended_at(expected, ends))
    # rows ended at many steps, early and late, and some wrote to the limit
    assert len(lengths) >= 5 and 16 in lengths and min(lengths) <= 2, lengths


def test_what_the_loop_does_not_decode_goes_to_generate(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = tiny.build_tokenizer()
    # (helpers' Llama has attention dropout, which TRL's generation in training mode draws)
    assert rollout_generator.unsupported(model("llama", "sdpa"), GenerationConfig()) == (
        "a model with dropout (attention_dropout 0.1), drawn while TRL generates in training mode"
    )
    built = model("qwen2", "sdpa").eval()
    ids, mask = left_padded(tokenizer, PROMPTS[:2])
    ids = ids % built.config.vocab_size
    penalized = GenerationConfig(max_new_tokens=4, do_sample=False, repetition_penalty=1.3, pad_token_id=0)
    reason = rollout_generator.unsupported(built, built._prepare_generation_config(penalized)[0])
    assert reason == "repetition_penalty 1.3"
    beams = GenerationConfig(max_new_tokens=4, num_beams=2, pad_token_id=0)
    reason = rollout_generator.unsupported(built, built._prepare_generation_config(beams)[0])
    assert reason == "generation settings num_beams=2"
    plain = GenerationConfig(max_new_tokens=4, do_sample=True, temperature=0.7, top_p=0.9, pad_token_id=0)
    assert rollout_generator.unsupported(built, built._prepare_generation_config(plain)[0]) is None

    decoded: List[int] = []
    generate = rollout_generator.generate
    monkeypatch.setattr(rollout_generator, "generate", lambda *args: decoded.append(1) or generate(*args))
    expected = built.generate(input_ids=ids, attention_mask=mask, generation_config=penalized)
    with rollout_generator.generating(built):
        assert torch.equal(built.generate(input_ids=ids, attention_mask=mask, generation_config=penalized), expected)
        assert not decoded
        built.generate(input_ids=ids, attention_mask=mask, generation_config=plain)
        assert decoded == [1]
    assert "generate" not in vars(built)


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_a_trainer_s_rollouts_come_from_the_generator_unless_the_spec_turns_it_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    decoded: List[int] = []
    generate = rollout_generator.generate
    monkeypatch.setattr(rollout_generator, "generate", lambda *args: decoded.append(len(args[1])) or generate(*args))
    training = {**load_template(f"{algorithm}/tiny.yaml")["training"], "max_steps": 2}
    # the built-in tiny Llama, without the template's dropout
    undropped = {"name_or_path": "builtin:tiny-llama"}
    trainer = build_trainer(tiny_job(tmp_path / "on", algorithm, training=training, model=undropped))
    trainer.train()
    rows = trainer.args.per_device_train_batch_size * trainer.args.steps_per_generation
    assert decoded == [rows] * 2 and getattr(trainer, rollout_generator.NAME)
    assert [entry["step"] for entry in trainer.state.log_history if "loss" in entry] == [1, 2]

    decoded.clear()
    switches = {"training": training, "generation": {"rollout_generator": False}}
    job = tiny_job(tmp_path / "off", algorithm, model=undropped, **switches)
    off = build_trainer(dataclasses.replace(job, generation=job.spec.generation))
    # the template's model has dropout: generate (the job's first lines say why)
    with_dropout = build_trainer(tiny_job(tmp_path / "dropout", algorithm, training=training))
    for trained in (off, with_dropout):
        trained.train()
        assert decoded == [] and not getattr(trained, rollout_generator.NAME, False)
