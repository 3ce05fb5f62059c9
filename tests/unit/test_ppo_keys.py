"""PPO's ``training`` accepts only what posttrain's PPO trainer honours; the rest is refused with the reason.

The partition of PPOConfig's fields (honoured, package-owned, refused) is
checked against the installed transformers, the refusal against the
validator, and the honoured optimizer, schedule and activation checkpointing
against a real trainer, in process on CPU.
"""

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import TEMPLATES, load_template
from posttrain.components.spec.fields import config_fields
from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.registry import PPOSpec
from posttrain.entrypoints.trainers.ppo_trainer import PPOConfig, PPOTrainer
from ppo_setup import length
from ppo_setup import make_trainer as realistic_trainer

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
    del raw["training"]["optim_args"]  # LOMO reads none
    expected = "training.optim: 'lomo' is not supported by posttrain.ppo; it steps inside HF Trainer's backward"
    assert expected in problems_of(raw)
    raw = load_template("ppo/tiny.yaml")
    raw["training"]["lr_scheduler_type"] = "reduce_lr_on_plateau"
    assert "training.lr_scheduler_type: 'reduce_lr_on_plateau' is not supported by posttrain.ppo" in problems_of(raw)


# ---------------------------------------------------------------- the trainer


def make_trainer(tmp_path: Path, **training: Any) -> PPOTrainer:
    """test_ppo_realistic's trainer (the Llama-3-shaped tiny model), in two mini-batches."""
    return realistic_trainer(tmp_path, [length], **{"num_mini_batches": 2, **training})


def test_optim_and_the_scheduler_kwargs_reach_the_optimizer_and_the_schedule(tmp_path: Path) -> None:
    trainer = make_trainer(
        tmp_path,
        optim="sgd",
        optim_args="momentum=0.9",
        learning_rate=1e-3,
        weight_decay=0.1,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr": 1e-5},
    )
    optimizer = trainer.optimizer.optimizer  # accelerate's wrapper around it
    assert type(optimizer) is torch.optim.SGD and optimizer.defaults["momentum"] == 0.9
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0  # HF's split: no decay on norms
    model = trainer.accelerator.unwrap_model(trainer.model)
    norms = {id(p) for name, p in model.named_parameters() if "norm" in name}
    assert norms and norms <= {id(p) for p in plain["params"]}
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(1e-3)
    trainer.train()  # 1 iteration x 2 mini-batches: the cosine ends at min_lr
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(1e-5)


def test_a_refused_optim_fails_in_process_too(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="optim='lomo' is not supported by posttrain's PPO"):
        make_trainer(tmp_path, optim="lomo")


def test_activation_checkpointing_runs_in_eval_mode_and_changes_no_number(tmp_path: Path) -> None:
    plain = make_trainer(tmp_path / "plain", optim="sgd")
    checkpointed = make_trainer(tmp_path / "checkpointed", optim="sgd", activation_checkpointing=True)
    model = checkpointed.accelerator.unwrap_model(checkpointed.model)
    calls = {"policy": 0, "value_model": 0}
    for part in calls:
        layers = getattr(model, part).model.layers
        assert len(layers) > 0 and all(layer.gradient_checkpointing and not layer.training for layer in layers)
        for layer in layers:
            checkpoint = layer._gradient_checkpointing_func

            def counted(*args: Any, _checkpoint: Any = checkpoint, _part: str = part, **kwargs: Any) -> Any:
                calls[_part] += 1
                return _checkpoint(*args, **kwargs)

            layer._gradient_checkpointing_func = counted
    plain.train()
    checkpointed.train()
    # the update's forwards (2 mini-batches x 2 layers) ran checkpointed; the rollout's (no grad) did not
    assert calls == {"policy": 4, "value_model": 4}
    trained = dict(plain.accelerator.unwrap_model(plain.model).named_parameters())
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter, trained[name], rtol=1e-5, atol=1e-6, msg=name)
    assert checkpointed.state.log_history[0]["loss"] == pytest.approx(plain.state.log_history[0]["loss"], rel=1e-5)


def test_every_n_layers_checkpoints_every_nth_layer_of_both_models(tmp_path: Path) -> None:
    options = {"every_n_layers": 2, "use_reentrant": False}  # the value table takes it for PPO
    trainer = make_trainer(tmp_path, activation_checkpointing=True, activation_checkpointing_kwargs=options)
    model = trainer.accelerator.unwrap_model(trainer.model)
    for part in ("policy", "value_model"):
        layers = getattr(model, part).model.layers
        flags = [layer.gradient_checkpointing for layer in layers]
        assert len(flags) >= 2 and flags == [i % 2 == 0 for i in range(len(flags))]
    trainer.train()
    assert trainer.state.global_step == 1
