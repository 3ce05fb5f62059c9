"""Options a trainer reads only with another (or never): the spec refuses each, and SFT's loss masks need their kind
of rows. (Training with all of them at once gives the losses training without them gives:
``tests/integration/test_unused_options.py``.)"""

from pathlib import Path

import pytest
import torch

from helpers import load_template, refusal, stopped_in_process, tiny_job, trainer_with
from posttrain.components.spec.loading import SpecError, validate
from posttrain.entrypoints.inputs.data import check_loss_masks
from posttrain.entrypoints.job import runtime


def test_packing_without_max_length_is_refused_before_the_trainer_raises(tmp_path: Path) -> None:
    job = tiny_job(tmp_path, "sft")
    assert refusal(job, packing=True, max_length=None).startswith(
        "training.max_length: null cannot go with packing: true; expected max_length >= 1"
    )
    with pytest.raises(ValueError, match="When packing is enabled, `max_length` can't be `None`"):
        trainer_with(job, packing=True, max_length=None)


def test_online_dpo_refuses_evaluation_which_its_trainer_fails(tmp_path: Path) -> None:
    job = tiny_job(tmp_path, "online_dpo")
    raw = {**job.spec.model_dump(), "data": {**job.spec.data.model_dump(), "eval": job.spec.data.train.model_dump()}}
    with pytest.raises(Exception, match="data.eval: online DPO cannot evaluate"):
        validate(raw)
    assert "training.eval_strategy: not supported by posttrain.online_dpo" in refusal(job, eval_strategy="steps")
    trainer = trainer_with(job)
    with pytest.raises(ValueError, match="You must specify exactly one of input_ids or inputs_embeds"):
        trainer.evaluate(job.train_dataset)


def test_sfts_text_column_is_mapped_with_data_columns(tmp_path: Path) -> None:
    job = tiny_job(tmp_path, "sft")
    assert "map yours with data.columns" in refusal(job, dataset_text_field="content")


def test_sfts_loss_masks_need_their_kind_of_rows(tmp_path: Path) -> None:
    from datasets import Dataset

    # chat messages
    job = tiny_job(tmp_path, "sft")
    messages = job.train_dataset
    text = Dataset.from_list([{"text": "Blue is the colour of the sky."}] * 16)
    # completion_only_loss on messages: TRL trains on every token, as without it, and says nothing
    masked = trainer_with(job, completion_only_loss=True)
    torch.manual_seed(0)
    batch = next(iter(masked.get_train_dataloader()))
    torch.manual_seed(0)
    assert torch.equal(batch["labels"], next(iter(trainer_with(job).get_train_dataloader()))["labels"])
    with pytest.raises(SpecError, match="training.completion_only_loss: true masks the prompt of prompt/completion"):
        check_loss_masks(masked.args, [("data.train", messages)])
    # assistant_only_loss on text: TRL raises once the model is loaded
    assistant = trainer_with(job, assistant_only_loss=True).args
    check_loss_masks(assistant, [("data.train", messages)])
    with pytest.raises(SpecError, match="training.assistant_only_loss: true masks all but the assistant's turns"):
        check_loss_masks(assistant, [("data.train", text)])
    with pytest.raises(ValueError, match="the dataset is not conversational"):
        trainer_with(job, text, assistant_only_loss=True)


@pytest.mark.usefixtures("job_process")
def test_the_job_checks_the_loss_masks_before_any_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(runtime, "load_model", lambda *args, **kwargs: pytest.fail("a model loaded"))
    # chat messages
    raw = load_template("sft/tiny.yaml")
    raw["training"].update(output_dir=str(tmp_path / "out"), completion_only_loss=True)
    assert (
        stopped_in_process("sft", validate(raw).to_json(), capsys).count(
            "posttrain: training.completion_only_loss: true masks the prompt of "
            "prompt/completion rows, and data.train has messages"
        )
        == 1
    )
    assert not (tmp_path / "out").exists()
