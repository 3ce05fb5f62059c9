"""Activation checkpointing's options: the spec takes the keys each trainer honours, and refuses the rest.

transformers' Trainer applies ``every_n_layers`` and ``offload`` and hands
the other keys to ``torch.utils.checkpoint``. TRL's DPO, KTO, GRPO, RLOO and
distillation trainers turn checkpointing off and on again themselves with the
options as given: torch then refuses the keys it does not know in the first
step, or (non-reentrant) hands them to the layers, which ignore them.
``selective`` is SFTTrainer's own. These tests train the tiny model to show
both sides: what the spec refuses fails or is lost in TRL, what it takes holds.
"""

import dataclasses
import re
from pathlib import Path
from typing import Any, Dict, List

import pytest
from transformers.modeling_layers import GradientCheckpointingLayer

from helpers import build_trainer, load_template, tiny_job
from posttrain.components.spec.loading import SpecError, validate
from posttrain.entrypoints.inputs.models import import_object
from posttrain.entrypoints.job import runtime
from posttrain.entrypoints.job.config import training_arguments


def _checkpointing_job(tmp_path: Path, algorithm: str, options: Dict[str, Any]) -> runtime.Job:
    """The tiny job with checkpointing on and ``options``, built past the spec's checks (as a plain script would)."""
    training = {
        **load_template(f"{algorithm}/tiny.yaml")["training"],
        "output_dir": str(tmp_path / "out"),
        "max_steps": 2,
        "activation_checkpointing": True,
    }
    job = tiny_job(tmp_path, algorithm, training=training)
    kwargs = training_arguments(job.spec, dict(job.spec.training))
    args = import_object(job.spec.config_class)(**{**kwargs, "activation_checkpointing_kwargs": dict(options)})
    return dataclasses.replace(job, args=args)


def _checkpointed_layers(trainer: Any) -> List[bool]:
    model = trainer.accelerator.unwrap_model(trainer.model)
    return [layer.gradient_checkpointing for layer in model.modules() if isinstance(layer, GradientCheckpointingLayer)]


REFUSED = [
    ("dpo", {"every_n_layers": 2}, "Unexpected keyword arguments: every_n_layers"),
    ("grpo", {"selective": True}, "Unexpected keyword arguments: selective"),
]


@pytest.mark.parametrize("algorithm, options, trl_says", REFUSED, ids=[a for a, _, _ in REFUSED])
def test_options_the_spec_refuses_fail_in_the_trainers_first_step(
    tmp_path: Path, algorithm: str, options: Dict[str, Any], trl_says: str
) -> None:
    raw = load_template(f"{algorithm}/tiny.yaml")
    raw["training"].update(activation_checkpointing=True, activation_checkpointing_kwargs=options)
    with pytest.raises(SpecError) as refused:
        validate(raw)
    (key,) = options
    assert refused.value.problems[0].startswith(f"training.activation_checkpointing_kwargs.{key}: unknown key")
    trainer = build_trainer(_checkpointing_job(tmp_path, algorithm, options))
    with pytest.raises(ValueError, match=re.escape(trl_says)):
        trainer.train()


@pytest.mark.parametrize("algorithm, honoured", [("sft", True), ("reward", True), ("dpo", False)])
def test_every_n_layers_holds_where_the_spec_takes_it(tmp_path: Path, algorithm: str, honoured: bool) -> None:
    options = {"every_n_layers": 2, "use_reentrant": False}
    raw = load_template(f"{algorithm}/tiny.yaml")
    raw["training"].update(activation_checkpointing=True, activation_checkpointing_kwargs=options)
    if honoured:
        validate(raw)
    else:
        with pytest.raises(SpecError, match="every_n_layers: unknown key"):
            validate(raw)
    trainer = build_trainer(_checkpointing_job(tmp_path, algorithm, options))
    trainer.train()
    # the tiny model's two layers: every second one is checkpointed; DPO turned checkpointing off and on again
    # around the reference's forward without every_n_layers, so both are
    assert _checkpointed_layers(trainer) == ([True, False] if honoured else [True, True])


def test_sft_takes_selective_checkpointing_and_trains_with_it(tmp_path: Path) -> None:
    options = {"selective": True, "use_reentrant": False}
    raw = load_template("sft/tiny.yaml")
    raw["training"].update(activation_checkpointing=True, activation_checkpointing_kwargs=options)
    validate(raw)
    trainer = build_trainer(_checkpointing_job(tmp_path, "sft", options))
    trainer.train()
    assert trainer.state.global_step == 2


def test_offload_is_refused_by_a_job_on_cpu(tmp_path: Path) -> None:
    raw = load_template("sft/tiny.yaml")
    raw["training"].update(
        output_dir=str(tmp_path), activation_checkpointing=True, activation_checkpointing_kwargs={"offload": True}
    )
    # offload is the Trainer's: fine on a GPU
    spec = validate(raw)
    with pytest.raises(SpecError, match=r"training.activation_checkpointing_kwargs: offload: true .* runs on CPU"):
        training_arguments(spec, dict(spec.training))
    trainer = build_trainer(_checkpointing_job(tmp_path, "sft", {"offload": True}))
    # what transformers would do
    with pytest.raises(RuntimeError, match="pin_memory=True requires a CUDA"):
        trainer.train()
