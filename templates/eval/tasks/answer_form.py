"""The answer_form task's data (``custom_dataset`` in answer_form.yaml): the held-out questions the templates ship,
found from this file, so that the task reads them from a checkout and from an installed posttrain alike."""

from pathlib import Path
from typing import Any

QUESTIONS = Path(__file__).resolve().parents[2] / "data" / "questions_heldout.jsonl"


def questions(**_: Any) -> Any:
    """The questions as the test split (the harness passes the task's metadata, which this task does not use)."""
    import datasets

    return datasets.DatasetDict({"test": datasets.load_dataset("json", data_files=str(QUESTIONS), split="train")})
