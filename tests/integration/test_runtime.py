"""Training in process what the spec refuses: every GRPO loss trains to finite losses, and robust DPO at
``label_smoothing`` 0.5 and ``eval_on_start`` without eval data fail as the spec's refusals say they would."""

import math
import re
from pathlib import Path

import pytest
import torch

from helpers import tiny_job, trainer_with
from posttrain.components.spec.loading import SpecError, validate

pytestmark = pytest.mark.usefixtures("hf_home")


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"])
def test_every_loss_grpo_has_is_taken_and_trains(tmp_path: Path, loss_type: str) -> None:
    job = tiny_job(tmp_path, "grpo")
    # TRL warns of luspo's token level: the paper's is sequence
    level = {"luspo": "sequence"}.get(loss_type, "token")
    loss = {"loss_type": loss_type, "importance_sampling_level": level}
    validate({**job.spec.model_dump(), "training": {**job.spec.training, **loss}})
    trainer = trainer_with(job, max_steps=2, **loss)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))


def test_robust_dpo_at_label_smoothing_one_half_is_refused_as_its_loss_divides_by_zero(tmp_path: Path) -> None:
    job = tiny_job(tmp_path, "dpo")
    robust = {"loss_type": ["robust"], "label_smoothing": 0.5}
    with pytest.raises(SpecError, match=re.escape("training.label_smoothing: 0.5 cannot go with loss_type: [robust]")):
        validate({**job.spec.model_dump(), "training": {**job.spec.training, **robust}})
    # TRL only warns
    trainer = trainer_with(job, max_steps=1, **robust)
    trainer.train()
    # 0 / 0 (transformers logs a NaN loss as 0)
    assert math.isnan(trainer.state.log_history[0]["grad_norm"])


def test_eval_on_start_without_eval_data_is_refused_before_train_raises(tmp_path: Path) -> None:
    job = tiny_job(tmp_path, "sft")
    with pytest.raises(SpecError, match="training.eval_on_start: true evaluates on data.eval before training"):
        validate({**job.spec.model_dump(), "training": {**job.spec.training, "eval_on_start": True}})
    # builds: no check until train()
    trainer = trainer_with(job, eval_on_start=True)
    with pytest.raises(ValueError, match="evaluation requires an eval_dataset"):
        trainer.train()
