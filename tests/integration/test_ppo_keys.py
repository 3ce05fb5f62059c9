"""PPO's honoured keys hold in training: the optimizer's and the schedule's options reach them, and activation
checkpointing (of every n-th layer too) runs in eval mode and changes no number. In process on CPU."""

from pathlib import Path
from typing import Any

import pytest
import torch

from ppo_setup import mini_batched_trainer as make_trainer


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
    # accelerate's wrapper around it
    optimizer = trainer.optimizer.optimizer
    assert type(optimizer) is torch.optim.SGD and optimizer.defaults["momentum"] == 0.9
    decayed, plain = optimizer.param_groups
    # HF's split: no decay on norms
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    model = trainer.accelerator.unwrap_model(trainer.model)
    norms = {id(p) for name, p in model.named_parameters() if "norm" in name}
    assert norms and norms <= {id(p) for p in plain["params"]}
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(1e-3)
    # 1 iteration x 2 mini-batches: the cosine ends at min_lr
    trainer.train()
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(1e-5)


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
    # the value table takes it for PPO
    options = {"every_n_layers": 2, "use_reentrant": False}
    trainer = make_trainer(tmp_path, activation_checkpointing=True, activation_checkpointing_kwargs=options)
    model = trainer.accelerator.unwrap_model(trainer.model)
    for part in ("policy", "value_model"):
        layers = getattr(model, part).model.layers
        flags = [layer.gradient_checkpointing for layer in layers]
        assert len(flags) >= 2 and flags == [i % 2 == 0 for i in range(len(flags))]
    trainer.train()
    assert trainer.state.global_step == 1
