"""The spec's tools in a GRPO trainer the job builds: TRL's loop runs the model's calls with them, in process.

The model's first turn is fixed to a call (a random tiny model writes none); everything after it is the job's
and TRL's own: the prompt rendered with the tool's schema, the call parsed, the user's function run, its result
in the conversation, the model generating again, the tool metrics logged. (Checks before any model loads:
tests/unit/inputs/test_tools.py.)
"""

import json
from pathlib import Path
from typing import Any, List

import pytest

from helpers import build_trainer, tiny_job
from posttrain.entrypoints.inputs import tiny
from posttrain.entrypoints.records.curves import CURVES_FILE, METRICS_FILE, PLOTTED, read_embedded
from posttrain.entrypoints.records.metrics import MetricsLog

TOOLS = '''
from pathlib import Path

CALLS = Path(__file__).parent / "calls.log"


def lookup(key: str) -> str:
    """The value stored under a key.

    Args:
        key: The key to look up.
    """
    with CALLS.open("a") as calls:
        calls.write(key + "\\n")
    return {"apple": "red"}[key]
'''
CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "apple"}}\n</tool_call><|im_end|>'


def test_the_specs_tool_answers_the_models_call_in_the_jobs_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "job_tools.py").write_text(TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    prompts = tmp_path / "questions.jsonl"
    prompts.write_text(json.dumps({"prompt": [{"role": "user", "content": "What is the value of apple?"}]}) + "\n")
    training = {
        "output_dir": str(tmp_path / "out"),
        "max_steps": 1,
        "per_device_train_batch_size": 2,
        "num_generations": 2,
        "max_completion_length": 64,
        "max_tool_calling_iterations": 1,
        "logging_steps": 1,
        "report_to": "none",
        "bf16": False,
    }
    job = tiny_job(
        tmp_path,
        "grpo",
        model={"name_or_path": tiny.NAME_TOOLS},
        data={"train": {"path": str(prompts)}},
        tools=[{"function": "job_tools:lookup"}],
        training=training,
    )
    trainer = build_trainer(job)
    assert [tool.__name__ for tool in trainer.tools] == ["lookup"]
    call = job.tokenizer(CALL, add_special_tokens=False)["input_ids"]
    generate = trainer._generate_single_turn
    turns: List[Any] = []

    def first_turn_calls(prompt_ids: Any, *args: Any, **kwargs: Any) -> Any:
        turns.append(prompt_ids)
        # the model's own turn after the tool's result
        if len(turns) > 1:
            return generate(prompt_ids, *args, **kwargs)
        return [list(call) for _ in prompt_ids], None

    monkeypatch.setattr(trainer, "_generate_single_turn", first_turn_calls)
    trainer.add_callback(MetricsLog(tmp_path / "out", "grpo", tiny.NAME_TOOLS, world_size=1))
    trainer.train()
    # the user's function ran once per completion, with what the model wrote
    assert (tmp_path / "calls.log").read_text() == "apple\napple\n"
    rendered = job.tokenizer.decode(turns[0][0])
    assert '"name": "lookup"' in rendered and "The value stored under a key." in rendered
    # the second turn reads the tool's result
    assert "<tool_response>\nred\n</tool_response>" in job.tokenizer.decode(turns[1][0])
    # what TRL logs of the calls reaches the run's metrics.jsonl and its curves
    logged = json.loads((tmp_path / "out" / METRICS_FILE).read_text().splitlines()[0])
    assert logged["tools/call_frequency"] == 1.0 and logged["tools/failure_frequency"] == 0.0
    [drawn] = read_embedded(tmp_path / "out" / CURVES_FILE)["runs"].values()
    assert {"tools/call_frequency", "tools/failure_frequency"} <= set(drawn) & set(PLOTTED)
