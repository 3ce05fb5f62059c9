"""Chat rows and the tokenizer's chat template: what TRL raises once the models are loaded, the job says first."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
from datasets import Dataset
from trl.chat_template_utils import qwen2_5_chat_template

from helpers import load_template, run_refused, tiny_job, trainer_with
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.inputs import tiny
from posttrain.entrypoints.inputs.chat_templates import check_chat_template

# its chat template has no {% generation %} markers
LLAMA3 = {"name_or_path": tiny.NAME_LLAMA3}
ASSISTANT_ONLY = SimpleNamespace(assistant_only_loss=True, chat_template_path=None)


pytestmark = pytest.mark.usefixtures("job_process")


def test_chat_rows_with_a_tokenizer_without_a_template_are_one_line_before_any_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    tokenizer = tiny.build_tokenizer()
    # as most base models' tokenizers
    tokenizer.chat_template = None
    model_dir = tmp_path / "base-model"
    tiny.build_model(tokenizer, transformers.LlamaForCausalLM).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    for algorithm in ("sft", "dpo"):
        # chat messages
        raw = load_template(f"{algorithm}/tiny.yaml")
        raw["model"]["name_or_path"] = str(model_dir)
        raw["training"]["output_dir"] = str(tmp_path / algorithm)
        err = run_refused(raw, monkeypatch, capsys)
        assert (
            err.count(
                f"posttrain: data.train: its rows are chat messages, and the tokenizer of {model_dir} has no "
                "chat template to render them; use a model that has one"
            )
            == 1
        ), err
        assert not (tmp_path / algorithm).exists()
    # text rows need no template
    text = Dataset.from_list([{"text": "Blue is the colour of the sky."}] * 4)
    check_chat_template(None, tokenizer, [("data.train", text)], str(model_dir))


def test_assistant_only_loss_needs_a_template_trl_can_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    job = tiny_job(tmp_path, "sft", model=LLAMA3)
    # what TRL did: it raised while building the trainer, the models loaded
    with pytest.raises(ValueError, match="The chat template is not training-compatible"):
        trainer_with(job, assistant_only_loss=True)
    raw = load_template("sft/tiny.yaml")
    raw["model"] = LLAMA3
    raw["training"].update(output_dir=str(tmp_path / "out"), assistant_only_loss=True)
    err = run_refused(raw, monkeypatch, capsys)
    assert (
        err.count(
            f"posttrain: training.assistant_only_loss: the chat template of {tiny.NAME_LLAMA3} has no "
            "{% generation %} markers around the assistant's turns, and TRL does not know how to add them "
            "to it; add them in a template file given as training.chat_template_path"
        )
        == 1
    ), err

    # a template file with the markers: the check and TRL take it, and the loss covers only the assistant's turns
    template = tmp_path / "marked.jinja"
    template.write_text(tiny.CHAT_TEMPLATE)
    marked = trainer_with(job, assistant_only_loss=True, chat_template_path=str(template))
    check_chat_template(marked.args, job.tokenizer, [("data.train", job.train_dataset)], tiny.NAME_LLAMA3)
    torch.manual_seed(0)
    labelled = int((next(iter(marked.get_train_dataloader()))["labels"] != -100).sum())
    torch.manual_seed(0)
    whole = trainer_with(job, chat_template_path=str(template)).get_train_dataloader()
    assert 0 < labelled < int((next(iter(whole))["labels"] != -100).sum()) / 2, labelled
    # a template TRL knows how to mark passes too
    monkeypatch.setattr(job.tokenizer, "chat_template", qwen2_5_chat_template)
    check_chat_template(ASSISTANT_ONLY, job.tokenizer, [("data.train", job.train_dataset)], tiny.NAME_LLAMA3)


def test_a_chat_template_path_that_is_no_template_file_is_a_tokenizer_the_trainer_clones() -> None:
    chat = [("data.train", Dataset.from_list([{"messages": [{"role": "user", "content": "Hi"}]}]))]
    no_template = SimpleNamespace(chat_template=None)
    with pytest.raises(SpecError):
        check_chat_template(ASSISTANT_ONLY, no_template, chat, "m")
    cloned = SimpleNamespace(assistant_only_loss=True, chat_template_path="Qwen/Qwen2.5-0.5B-Instruct")
    check_chat_template(cloned, no_template, chat, "m")
    with pytest.raises(SpecError, match=r"training.chat_template_path: no such file: chat.jinja \(relative paths"):
        check_chat_template(SimpleNamespace(chat_template_path="chat.jinja"), no_template, chat, "m")
    # a file of another name: the trainer would ask the Hub for a tokenizer of that name
    with pytest.raises(
        SpecError,
        match=r"training.chat_template_path: README.md is a file, and the trainer reads "
        r"templates from .jinja or .j2 files only",
    ):
        check_chat_template(SimpleNamespace(chat_template_path="README.md"), no_template, chat, "m")
