"""``data.chat``: text prompts as chat messages, for chat models and tools (a hub data set's text questions)."""

import json
from pathlib import Path

import pytest

from helpers import REPO, load_template
from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.inputs.data import load_split
from posttrain.entrypoints.inputs.tools import check_tool_data


def test_text_prompts_become_a_system_and_a_user_message(tmp_path: Path) -> None:
    texts = tmp_path / "questions.jsonl"
    rows = [{"prompt": "What is 2 plus 3?", "answer": "5"}, {"prompt": "What is 4 plus 4?", "answer": "8"}]
    texts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    raw = load_template("grpo/tiny.yaml")
    raw["data"] = {"train": {"path": str(texts)}, "chat": {"system": "Answer with the number alone."}}
    spec = validate(raw)
    dataset = load_split(spec.data, spec.data_formats, "train", seed=0)
    assert dataset[1] == {
        "prompt": [
            {"role": "system", "content": "Answer with the number alone."},
            {"role": "user", "content": "What is 4 plus 4?"},
        ],
        "answer": "8",
    }
    check_tool_data([("data.train", dataset)])
    # no system message: the prompt alone, as the user's; chat prompts stay as they are
    raw["data"] = {"train": {"path": "templates/data/prompts.jsonl"}, "chat": {}}
    spec = validate(raw)
    alone = validate({**raw, "data": {"train": {"path": str(texts)}, "chat": {}}})
    assert load_split(alone.data, alone.data_formats, "train", seed=0)[0]["prompt"] == [
        {"role": "user", "content": "What is 2 plus 3?"}
    ]
    chats = load_split(spec.data, spec.data_formats, "train", seed=0)
    shipped = json.loads((REPO / "templates/data/prompts.jsonl").read_text().splitlines()[0])
    assert chats[0]["prompt"] == shipped["prompt"]


def test_an_unknown_key_of_data_chat_is_named() -> None:
    raw = load_template("grpo/tiny.yaml")
    raw["data"] = {**raw["data"], "chat": {"sytem": "x"}}
    with pytest.raises(SpecError, match="data.chat.sytem: unknown key; did you mean data.chat.system?"):
        validate(raw)
