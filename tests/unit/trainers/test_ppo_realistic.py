"""PPO on a model shaped like a real one (``builtin:tiny-llama3``), in process on CPU.

The friendly tiny model hid three bugs: its id 0 is its pad token, it has no
dropout and no sampling defaults. Here id 0 is ``!``, the config has
attention dropout, the generation config an instruct model's sampling
defaults, and the tokenizer a BOS and no pad token. Each test would fail on
the trainer as it was before these were fixed.
"""

from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
from transformers import GenerationConfig, LlamaForCausalLM

from helpers import load_template
from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.inputs import tiny
from posttrain.entrypoints.inputs.models import check_same_tokenizer
from posttrain.entrypoints.inputs.rewards import RewardCheck
from posttrain.entrypoints.trainers.ppo_math import response_logprobs
from posttrain.entrypoints.trainers.ppo_trainer import PPOTrainer
from ppo_setup import length, make_trainer, tokenizer


def rollout(trainer: PPOTrainer, iteration: int = 0) -> Dict[str, Any]:
    return trainer.rollouts.collect(trainer.accelerator.unwrap_model(trainer.model), iteration, trainer.kl_coef)


def test_the_realistic_model_is_shaped_like_real_ones() -> None:
    tok = tokenizer()
    assert (
        tok.convert_ids_to_tokens(0) == "!"
        and tok.bos_token_id == len(tok) - 4
        and tok.pad_token_id == tok.eos_token_id
    )
    model = tiny.build_model_llama3(tok, LlamaForCausalLM)
    assert model.config.attention_dropout > 0 and model.generation_config.repetition_penalty != 1.0


def test_plain_text_prompts_start_with_the_tokenizers_bos(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, [length])
    assert trainer.rollouts._encode_prompt("What is blue?")[0] == trainer.tokenizer.bos_token_id
    # the chat template writes it once
    assert trainer.rollouts.prompts[0][0] == trainer.tokenizer.bos_token_id
    assert trainer.rollouts.prompts[0].count(trainer.tokenizer.bos_token_id) == 1


def test_rewards_see_each_response_up_to_its_eos_without_padding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: List[str] = []

    def record(completions: List[Any], **_: Any) -> List[float]:
        seen.extend(c[0]["content"] for c in completions)
        return [0.0] * len(completions)

    trainer = make_trainer(tmp_path, [record])
    tok = trainer.tokenizer
    answers = [
        tok(" blue sky", add_special_tokens=False)["input_ids"],
        tok(" red", add_special_tokens=False)["input_ids"],
    ]
    policy = trainer.accelerator.unwrap_model(trainer.model).policy

    def generate(input_ids: torch.Tensor, **_: Any) -> torch.Tensor:
        # rows end early and are padded after their EOS, as generate pads finished rows; the last never ends
        rows = []
        for i in range(input_ids.shape[0]):
            answer = (
                answers[i % 2] + [tok.eos_token_id]
                if i < 7
                else tok(" sky" * 12, add_special_tokens=False)["input_ids"]
            )
            rows.append((answer + [tok.pad_token_id] * 12)[:12])
        return torch.cat([input_ids, torch.tensor(rows)], dim=1)

    monkeypatch.setattr(policy, "generate", generate)
    rollout(trainer)
    expected = [tok.decode(answers[i % 2]) for i in range(7)]
    assert seen[:7] == expected and seen[:2] == [" blue sky", " red"]
    assert "!" not in "".join(seen), "padding decoded as token id 0"


def test_an_async_reward_is_awaited(tmp_path: Path) -> None:
    # TRL's trainers take these too
    async def judged(completions: List[Any], **_: Any) -> List[float]:
        return [float(len(c[0]["content"])) for c in completions]

    check = RewardCheck(stop_at_step_end=False)
    scores = rollout(make_trainer(tmp_path, [check.wrap(judged, "rewards.0")]))["scores"]
    assert scores.shape == (8,) and bool((scores > 0).any())


@pytest.mark.parametrize("bf16", [False, True])
def test_with_dropout_in_the_config_kl_starts_at_zero_and_the_first_ratio_is_one(tmp_path: Path, bf16: bool) -> None:
    trainer = make_trainer(tmp_path, [length], bf16=bf16)
    batch = rollout(trainer)
    assert batch["kl"].abs().max().item() == 0.0, "policy and reference must run alike (no dropout, same autocast)"
    # the first mini-batch's forward
    logits, _ = trainer.model(batch["tokens"], batch["attention_mask"])
    logprobs, _ = response_logprobs(logits, batch["tokens"], batch["prompt_length"], trainer.args.temperature)
    mask = batch["response_mask"].bool()
    assert torch.equal(logprobs[mask], batch["logprobs"][mask]), "ratio != 1 before any update"


def test_sampling_defaults_of_the_generation_config_do_not_change_the_rollout(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, [length])
    policy = trainer.accelerator.unwrap_model(trainer.model).policy
    # an instruct model's defaults, min-p exaggerated: on a near-uniform random model a mild leak could
    # pick the same tokens by chance; min-p 0.9 leaves only the few likeliest tokens
    policy.generation_config.min_p = 0.9
    with_defaults = rollout(trainer)
    instruct = policy.generation_config
    policy.generation_config = GenerationConfig(bos_token_id=instruct.bos_token_id, eos_token_id=instruct.eos_token_id)
    neutral = rollout(trainer)
    assert torch.equal(with_defaults["tokens"], neutral["tokens"])
    assert torch.equal(with_defaults["logprobs"], neutral["logprobs"])
    policy.generation_config = instruct
    trainer.save_model(str(tmp_path / "saved"))
    assert GenerationConfig.from_pretrained(tmp_path / "saved").repetition_penalty == instruct.repetition_penalty


def test_policy_and_value_gradients_are_clipped_apart(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, [length], max_grad_norm=1.0)
    model = trainer.accelerator.unwrap_model(trainer.model)
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 100.0)
    trainer._clip_gradients(1.0)
    for part in (model.policy, model.value_model):
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in part.parameters()]))
        assert norm.item() == pytest.approx(1.0, rel=1e-4)


def test_an_extra_model_with_another_tokenizer_is_refused() -> None:
    spec = validate(load_template("ppo/tiny.yaml"))
    with pytest.raises(SpecError, match=r"value_model: builtin:tiny-llama's tokenizer numbers .* differently"):
        check_same_tokenizer(tiny.NAME, spec.model, tokenizer(), "value_model")
    check_same_tokenizer(tiny.NAME_LLAMA3, spec.model, tokenizer(), "value_model")
