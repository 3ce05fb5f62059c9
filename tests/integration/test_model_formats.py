"""A Mistral model directory with only its own tokenizer file (``tekken.json``, or a SentencePiece
``tokenizer.model``) trains in process, and the tokenizer it saves encodes as the one it loaded."""

import json
from pathlib import Path
from typing import Dict

import pytest

from helpers import MISTRAL_FORMATS as FORMATS
from helpers import REPO, read_json, run_tiny_sft

# runs in process as a job's rank 0
pytestmark = pytest.mark.usefixtures("job_process")


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_mistral_model_directory_trains_with_its_own_tokenizer_file(
    tmp_path: Path, mistral_models: Dict[str, Path], name: str
) -> None:
    from transformers import AutoTokenizer

    rows = [json.loads(line) for line in (REPO / "templates/data/sft_chat.jsonl").read_text().splitlines()]
    text = tmp_path / "text.jsonl"
    text.write_text(
        "".join(json.dumps({"text": " ".join(m["content"] for m in row["messages"])}) + "\n" for row in rows)
    )
    output_dir = run_tiny_sft(tmp_path, mistral_models[name], str(text))
    summary = read_json(output_dir / "run_summary.json")
    assert summary["metrics_last"]["loss"] < 0.95 * summary["metrics_first"]["loss"], summary["metrics_last"]
    source, saved = (AutoTokenizer.from_pretrained(path) for path in (mistral_models[name], output_dir))
    sample = "The capital of Japan is Tokyo."
    assert saved(sample)["input_ids"] == source(sample)["input_ids"] and saved.eos_token == source.eos_token == "</s>"
