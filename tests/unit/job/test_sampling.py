"""The order of the training rows: what the spec and the job refuse of the sampling options, next to what the
trainers do with them."""

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers.trainer_pt_utils import LengthGroupedSampler

from helpers import load_template, refusal, stopped_in_process, tiny_job, trainer_with
from posttrain.components.spec.loading import SpecError, validate
from posttrain.entrypoints.inputs.data import check_length_column
from posttrain.entrypoints.job import runtime


def order(trainer: Any) -> list:
    """The first batches of the trainer's data loader (accelerate's, which reads data_seed), as text."""
    torch.manual_seed(0)
    return [repr(batch) for batch, _ in zip(trainer.get_train_dataloader(), range(3))]


@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "distill"])
def test_trainers_with_a_repeat_sampler_never_read_the_sampling_options(tmp_path: Path, algorithm: str) -> None:
    job = tiny_job(tmp_path, algorithm)
    for key, value in (("train_sampling_strategy", "sequential"), ("length_column_name", "n"), ("data_seed", 1)):
        assert f"training.{key}: {value} does nothing; drop it (the trainer draws its prompts with TRL's " in refusal(
            job, **{key: value}
        )
    default = trainer_with(job)
    options = {"train_sampling_strategy": "group_by_length", "length_column_name": "nowhere", "data_seed": 123}
    assert type(trainer_with(job, **options)._get_train_sampler()).__name__ == "RepeatSampler"
    assert order(trainer_with(job, **options)) == order(default)
    # what orders the prompts
    assert order(trainer_with(job, seed=1)) != order(default)


def test_length_column_and_data_seed_count_only_where_the_order_uses_them(tmp_path: Path) -> None:
    job = tiny_job(tmp_path, "sft")
    assert refusal(job, length_column_name="n").startswith(
        "training.length_column_name: n does nothing with train_sampling_strategy: random (TRL's default); set "
        "train_sampling_strategy: group_by_length or batch_rebalance, or drop it"
    )
    assert order(trainer_with(job, length_column_name="nowhere")) == order(trainer_with(job))
    # data_seed seeds the random order only
    assert refusal(job, train_sampling_strategy="sequential", data_seed=1).startswith(
        "training.data_seed: 1 does nothing with train_sampling_strategy: sequential; set train_sampling_strategy: "
        "random or group_by_length, or drop it"
    )
    for strategy, counts in (("sequential", False), ("batch_rebalance", False), ("random", True)):
        seeded = order(trainer_with(job, train_sampling_strategy=strategy, data_seed=123))
        assert (seeded != order(trainer_with(job, train_sampling_strategy=strategy))) == counts, strategy
    validate({**job.spec.model_dump(), "training": {**job.spec.training, "train_sampling_strategy": "group_by_length"}})
    check_length_column(
        job.spec.rows_hold_input_ids,
        trainer_with(job, train_sampling_strategy="group_by_length").args,
        [],
        # input_ids
    )


def test_length_grouping_needs_the_lengths_where_the_rows_hold_no_input_ids(tmp_path: Path) -> None:
    job = tiny_job(tmp_path, "dpo")
    lengths = [5 + index % 7 for index in range(len(job.train_dataset))]
    with_lengths = job.train_dataset.add_column("length", lengths)
    # the trainer removes the column as unused unless told not to
    assert refusal(job, train_sampling_strategy="group_by_length") == (
        "training.remove_unused_columns: true (TRL's default) cannot go with train_sampling_strategy: "
        "group_by_length; expected false (the sampler reads each row's length from the data's length_column_name "
        "column, which the trainer removes as unused otherwise: its tokenised rows hold no input_ids to measure)"
    )
    no_input_ids = re.escape("Can only automatically infer lengths for datasets whose items are dictionaries with an")
    for strategy in ("group_by_length", "batch_rebalance"):
        with pytest.raises(ValueError, match=no_input_ids):
            trainer_with(job, with_lengths, train_sampling_strategy=strategy).get_train_dataloader()
    # kept, the lengths must be in the data: the job says so before any model loads
    kept = {"train_sampling_strategy": "group_by_length", "remove_unused_columns": False}
    validate({**job.spec.model_dump(), "training": {**job.spec.training, **kept}})
    trainer = trainer_with(job, **kept)
    with pytest.raises(SpecError, match="data.train: train_sampling_strategy: group_by_length reads each row's length"):
        check_length_column(job.spec.rows_hold_input_ids, trainer.args, [("data.train", job.train_dataset)])
    with pytest.raises(ValueError, match=no_input_ids):
        trainer.get_train_dataloader()
    trainer = trainer_with(job, with_lengths, **kept)
    check_length_column(job.spec.rows_hold_input_ids, trainer.args, [("data.train", with_lengths)])
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, LengthGroupedSampler) and sampler.lengths == lengths
    # group_by_length orders the evaluation by length too; batch_rebalance only the training
    with pytest.raises(SpecError, match="data.eval: train_sampling_strategy: group_by_length reads each row's length"):
        check_length_column(
            job.spec.rows_hold_input_ids, trainer.args, [("data.train", with_lengths), ("data.eval", job.train_dataset)]
        )
    with pytest.raises(ValueError, match=no_input_ids):
        trainer.get_eval_dataloader(job.train_dataset)
    rebalanced = trainer_with(job, with_lengths, train_sampling_strategy="batch_rebalance", remove_unused_columns=False)
    check_length_column(
        job.spec.rows_hold_input_ids, rebalanced.args, [("data.train", with_lengths), ("data.eval", job.train_dataset)]
    )
    rebalanced.get_eval_dataloader(job.train_dataset)


@pytest.mark.usefixtures("job_process")
def test_the_job_names_a_missing_length_column_before_any_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(runtime, "load_model", lambda *args, **kwargs: pytest.fail("a model loaded"))
    raw = load_template("dpo/tiny.yaml")
    raw["training"].update(
        output_dir=str(tmp_path / "out"),
        train_sampling_strategy="batch_rebalance",
        remove_unused_columns=False,
        length_column_name="tokens",
    )
    assert (
        stopped_in_process("dpo", validate(raw).to_json(), capsys).count(
            "posttrain: data.train: train_sampling_strategy: batch_rebalance reads each "
            "row's length (in tokens) from column 'tokens', which data.train does not "
            "have; add it"
        )
        == 1
    )
    assert not (tmp_path / "out").exists()


def test_online_dpo_keeps_its_prompt_columns(tmp_path: Path) -> None:
    job = tiny_job(tmp_path, "online_dpo")
    assert "training.remove_unused_columns: not supported by posttrain.online_dpo; online DPO's rows are prompts" in (
        refusal(job, remove_unused_columns=True)
    )
    with pytest.raises(ValueError, match="No columns in the dataset match the model's forward method signature"):
        trainer_with(job, remove_unused_columns=True).get_train_dataloader()
    # TRL's default, false
    next(iter(trainer_with(job).get_train_dataloader()))
