"""The spec's tools in a GRPO trainer the job builds: TRL's loop runs the model's calls with them, in process.

The model's first turn is fixed to a call (a random tiny model writes none); everything after it is the job's
and TRL's own: the prompt rendered with the tool's schema, the call parsed, the user's function run, its result
in the conversation, the model generating again, the tool metrics logged. (Checks before any model loads:
tests/unit/inputs/test_tools.py.)
"""

import json
from pathlib import Path
from typing import Any, List, Tuple

import pytest

from helpers import build_trainer, tiny_job
from posttrain.entrypoints.inputs import tiny
from posttrain.entrypoints.records.curves import CURVES_FILE, METRICS_FILE, PLOTTED, read_embedded
from posttrain.entrypoints.records.metrics import MetricsLog
from posttrain.entrypoints.records.samples import SAMPLES_FILE, RolloutSamples

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


class Ledger:
    """Each rollout's own: the key its row asks for, and the keys the model looked up."""

    def __init__(self, values: dict) -> None:
        self.values = values

    def reset(self, **row) -> None:
        self.asked, self.looked_up = row["key"], []

    def lookup(self, key: str) -> str:
        """The value stored under a key.

        Args:
            key: The key to look up.
        """
        self.looked_up.append(key)
        return self.values[key]

    def get_reward(self) -> float:
        return float(self.looked_up == [self.asked])
'''
CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "apple"}}\n</tool_call><|im_end|>'


TRAINING = {
    "max_steps": 1,
    "per_device_train_batch_size": 2,
    "num_generations": 2,
    "max_completion_length": 64,
    "max_tool_calling_iterations": 1,
    "logging_steps": 1,
    "report_to": "none",
    "bf16": False,
}


def job_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **sections: Any) -> Any:
    """The job of a GRPO spec on the tiny tools model, asking for apple's value, with ``sections`` (tools, an
    environment, rewards); its tool module importable."""
    (tmp_path / "job_tools.py").write_text(TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    prompts = tmp_path / "questions.jsonl"
    question = [{"role": "user", "content": "What is the value of apple?"}]
    prompts.write_text(json.dumps({"prompt": question, "key": "apple"}) + "\n")
    training = {**TRAINING, "output_dir": str(tmp_path / "out")}
    model, data = {"name_or_path": tiny.NAME_TOOLS}, {"train": {"path": str(prompts)}}
    return tiny_job(tmp_path, "grpo", model=model, data=data, training=training, **sections)


def train_calling_first(job: Any, monkeypatch: pytest.MonkeyPatch) -> Tuple[Any, List[Any]]:
    """The trainer the job builds, trained one step with the model's first turn a call of lookup(apple); the
    trainer and the prompt ids of each turn."""
    trainer = build_trainer(job)
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
    trainer.add_callback(MetricsLog(Path(job.args.output_dir), "grpo", tiny.NAME_TOOLS, world_size=1))
    trainer.add_callback(RolloutSamples(trainer, Path(job.args.output_dir)))
    trainer.train()
    return trainer, turns


def test_the_specs_tool_answers_the_models_call_in_the_jobs_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = job_with(tmp_path, monkeypatch, tools=[{"function": "job_tools:lookup"}])
    trainer, turns = train_calling_first(job, monkeypatch)
    assert [tool.__name__ for tool in trainer.tools] == ["lookup"]
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
    # and samples.jsonl shows each rollout whole: the call, the tool's result, the model's answer after it
    samples = [json.loads(line) for line in (tmp_path / "out" / SAMPLES_FILE).read_text().splitlines()]
    assert len(samples) == 2 and samples[0]["step"] == 1 and samples[0]["prompt"][0]["role"] == "user"
    call, result, *answer = samples[0]["completion"]
    assert call["tool_calls"][0]["function"] == {"name": "lookup", "arguments": {"key": "apple"}}
    assert (result["role"], result["content"]) == ("tool", "red") and answer[0]["role"] == "assistant"
    assert set(samples[0]["rewards"]) == {"contains"} and isinstance(samples[0]["advantage"], float)


def test_the_specs_environment_is_built_per_rollout_and_scores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No reward in the spec: the environment's get_reward scores each rollout, from what its own instance saw."""
    environment = {"factory": "job_tools:Ledger", "args": {"values": {"apple": "red"}}}
    job = job_with(tmp_path, monkeypatch, environment=environment, rewards=[])
    trainer, turns = train_calling_first(job, monkeypatch)
    # reset(**row) read the row's key; lookup, the environment's method, answered the call
    assert "<tool_response>\nred\n</tool_response>" in job.tokenizer.decode(turns[1][0])
    logged = json.loads((tmp_path / "out" / METRICS_FILE).read_text().splitlines()[0])
    assert logged["tools/call_frequency"] == 1.0 and logged["rewards/Ledger/mean"] == 1.0
