"""Real tokenizer formats, as the mistral_common package ships Mistral's own files: a model directory whose
tokenizer is Mistral's ``tekken.json`` alone, and one whose tokenizer is a SentencePiece ``tokenizer.model`` alone,
load as transformers reads them (a tiny random model built around each). (Training on each:
``tests/integration/test_model_formats.py``.)"""

import importlib.util
from pathlib import Path
from typing import Dict

import pytest

from helpers import MISTRAL_FORMATS as FORMATS
from helpers import run_tiny_sft
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.inputs.models import check_model_path

# runs in process as a job's rank 0
pytestmark = pytest.mark.usefixtures("job_process")


def test_chat_rows_with_mistrals_native_tokenizer_are_one_line(
    tmp_path: Path, mistral_models: Dict[str, Path], capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as stopped:
        run_tiny_sft(tmp_path, mistral_models["tekken"], "templates/data/sft_chat.jsonl")
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.count("posttrain: ") == 1
        and "posttrain: data.train: its rows are chat messages, and the tokenizer of" in err
    )
    assert "has no chat template to render them" in err and not (tmp_path / "out" / "model.safetensors").exists()


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_tokenizer_whose_reader_is_missing_is_named_with_its_package(
    mistral_models: Dict[str, Path], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = {"tekken": "mistral_common", "sentencepiece": "sentencepiece"}[name]
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda wanted, *a: None if wanted == module else find_spec(wanted, *a)
    )
    with pytest.raises(SpecError) as error:
        check_model_path(str(mistral_models[name]))
    file = FORMATS[name][1]
    assert error.value.problems[0].startswith(
        f"model.name_or_path: {mistral_models[name]}'s tokenizer is {file}, which "
    )
    assert error.value.problems[0].endswith(f"pip install {module.replace('_', '-')}")
