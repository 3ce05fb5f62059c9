"""A built-in reward reading a column that ``remove_unused_columns`` removes: TRL raised a KeyError once generating,
and the spec refuses it first."""

from pathlib import Path

import pytest

from helpers import tiny_job, trainer_with
from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.inputs.rewards import check_reward_columns


def test_a_builtin_reading_a_column_that_remove_unused_columns_removes(tmp_path: Path) -> None:
    job = tiny_job(tmp_path, "grpo", rewards=[{"builtin": "exact_match"}])
    answered = job.train_dataset.map(lambda row: {"answer": "blue"})
    spec = validate({**job.spec.model_dump(), "training": {**job.spec.training, "remove_unused_columns": True}})
    with pytest.raises(SpecError) as error:
        check_reward_columns(spec.rewards, spec.keeps_only_prompts, [("data.train", answered)])
    assert str(error.value) == (
        "training.remove_unused_columns: true removes column 'answer', which rewards.0 (exact_match) reads: the "
        "trainer keeps only prompt and images; set it false"
    )
    check_reward_columns(
        job.spec.rewards,
        job.spec.keeps_only_prompts,
        [("data.train", answered)],
        # TRL's default, false
    )
    # what TRL does, the model loaded and generating
    with pytest.raises(KeyError, match="answer"):
        trainer_with(job, answered, remove_unused_columns=True, max_steps=1).train()
