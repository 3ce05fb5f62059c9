"""PPO's ``training`` accepts only what posttrain's PPO trainer honours; the rest is refused with the reason.

The partition of PPOConfig's fields (honoured, package-owned, refused) is
checked against the installed transformers, and the refusal against the
validator. (The honoured optimizer, schedule and activation checkpointing in
training: ``tests/integration/test_ppo_keys.py``.)
"""

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from helpers import TEMPLATES, load_template
from posttrain.components.spec.fields import config_fields
from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.registry import PPOSpec
from posttrain.entrypoints.trainers.ppo_trainer import PPOConfig
from ppo_setup import mini_batched_trainer as make_trainer

FIELDS = set(config_fields(PPOSpec.config_class))


def problems_of(raw: Any) -> str:
    with pytest.raises(SpecError) as error:
        validate(raw)
    return str(error.value)


# ---------------------------------------------------------------- the partition


def test_every_field_is_exactly_one_of_honoured_owned_or_refused() -> None:
    honoured, owned = PPOSpec.honoured_keys, set(PPOSpec.owned_keys)
    refused = set(PPOSpec.refused_keys)
    assert not honoured - FIELDS, "honoured names that PPOConfig no longer has"
    assert not set(refused) - FIELDS
    for field in FIELDS:
        assert (field in honoured) + (field in owned) + (field in refused) == 1, field
    # the table is PPOConfig as installed: a field transformers adds or drops shows here (regenerate the table)
    assert FIELDS == {f.name for f in dataclasses.fields(PPOConfig) if f.init}


def test_the_refused_values_name_real_choices() -> None:
    for key, values in PPOSpec.refused_values.items():
        assert key in PPOSpec.honoured_keys
        choices = config_fields(PPOSpec.config_class)[key].choices
        assert choices is not None and set(values) <= set(choices), key


@pytest.mark.parametrize("template", sorted(p.name for p in (TEMPLATES / "ppo").glob("*.yaml")))
def test_the_ppo_templates_use_only_honoured_keys(template: str) -> None:
    assert set(load_template(f"ppo/{template}")["training"]) <= PPOSpec.honoured_keys


# ---------------------------------------------------------------- the validator


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("eval_steps", 10, "training.eval_steps: not supported by posttrain.ppo; PPO does not evaluate"),
        (
            "gradient_accumulation_steps",
            2,
            "training.gradient_accumulation_steps: not supported by posttrain.ppo; "
            "PPO steps the optimizer once per mini-batch; use training.num_mini_batches",
        ),
        ("push_to_hub", True, "training.push_to_hub: not supported by posttrain.ppo; PPO does not push to the Hub"),
        (
            "torch_compile",
            True,
            "training.torch_compile: not supported by posttrain.ppo; posttrain's PPO does not compile",
        ),
        (
            "neftune_noise_alpha",
            5.0,
            "training.neftune_noise_alpha: not supported by posttrain.ppo; posttrain's PPO trainer does not use it",
        ),
    ],
)
def test_a_refused_key_is_one_line_with_its_reason(key: str, value: Any, expected: str) -> None:
    raw = load_template("ppo/tiny.yaml")
    raw["training"][key] = value
    message = problems_of(raw)
    assert message.startswith(expected) and "\n" not in message, message


def test_honoured_keys_validate_and_refused_values_are_named() -> None:
    raw = load_template("ppo/tiny.yaml")
    raw["training"].update(
        optim="sgd",
        optim_args="momentum=0.9",
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr": 1e-5},
        activation_checkpointing=True,
        weight_decay=0.1,
        warmup_steps=0.1,
    )
    validate(raw)
    raw["training"]["optim"] = "lomo"
    # LOMO reads none
    del raw["training"]["optim_args"]
    expected = "training.optim: 'lomo' is not supported by posttrain.ppo; it steps inside HF Trainer's backward"
    assert expected in problems_of(raw)
    raw = load_template("ppo/tiny.yaml")
    raw["training"]["lr_scheduler_type"] = "reduce_lr_on_plateau"
    assert "training.lr_scheduler_type: 'reduce_lr_on_plateau' is not supported by posttrain.ppo" in problems_of(raw)


# ---------------------------------------------------------------- the trainer


def test_a_refused_optim_fails_in_process_too(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="optim='lomo' is not supported by posttrain's PPO"):
        make_trainer(tmp_path, optim="lomo")
