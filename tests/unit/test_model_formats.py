"""Real tokenizer formats, as the mistral_common package ships Mistral's own files: a model directory whose
tokenizer is Mistral's ``tekken.json`` alone, and one whose tokenizer is a SentencePiece ``tokenizer.model`` alone,
load and train as transformers reads them (a tiny random model built around each)."""

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Dict

import mistral_common
import pytest

from helpers import REPO, load_template, read_json, run_entrypoint
from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.inputs.models import check_model_path

SHIPPED = Path(mistral_common.__file__).parent / "data"
# (the file mistral_common ships, the name a model directory gives it, the tokenizer's vocabulary)
FORMATS = {
    "tekken": ("tekken_240911.json", "tekken.json", 131072),
    "sentencepiece": ("mistral_instruct_tokenizer_240323.model.v3", "tokenizer.model", 32768),
}


@pytest.fixture(scope="module")
def mistral_models(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    from transformers import MistralConfig, MistralForCausalLM

    built = {}
    for name, (shipped, file, vocab) in FORMATS.items():
        path = tmp_path_factory.mktemp("models") / name
        config = MistralConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            bos_token_id=1,
            eos_token_id=2,
        )
        MistralForCausalLM(config).save_pretrained(path)
        shutil.copy(SHIPPED / shipped, path / file)
        built[name] = path
    return built


def _run_sft(tmp_path: Path, model: Path, data: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("RANK", "0")
    raw = load_template("sft/tiny.yaml")
    raw["model"]["name_or_path"] = str(model)
    raw["data"]["train"]["path"] = data
    raw["training"].update(output_dir=str(tmp_path / "out"), max_steps=12, save_steps=100)
    run_entrypoint("sft", validate(raw).to_json())
    return tmp_path / "out"


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_mistral_model_directory_trains_with_its_own_tokenizer_file(
    tmp_path: Path, mistral_models: Dict[str, Path], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    rows = [json.loads(line) for line in (REPO / "templates/data/sft_chat.jsonl").read_text().splitlines()]
    text = tmp_path / "text.jsonl"
    text.write_text(
        "".join(json.dumps({"text": " ".join(m["content"] for m in row["messages"])}) + "\n" for row in rows)
    )
    output_dir = _run_sft(tmp_path, mistral_models[name], str(text), monkeypatch)
    summary = read_json(output_dir / "run_summary.json")
    assert summary["metrics_last"]["loss"] < 0.95 * summary["metrics_first"]["loss"], summary["metrics_last"]
    source, saved = (AutoTokenizer.from_pretrained(path) for path in (mistral_models[name], output_dir))
    sample = "The capital of Japan is Tokyo."
    assert saved(sample)["input_ids"] == source(sample)["input_ids"] and saved.eos_token == source.eos_token == "</s>"


def test_chat_rows_with_mistrals_native_tokenizer_are_one_line(
    tmp_path: Path, mistral_models: Dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as stopped:
        _run_sft(tmp_path, mistral_models["tekken"], "templates/data/sft_chat.jsonl", monkeypatch)
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
