"""samples.jsonl: the latest rollouts of each logged step, with what reward functions logged of each (TRL's
``log_extra``), from the trainer's own ``_logs`` (a real GRPO run writes it: tests/integration/test_tools.py); and
an evaluation's results, which keep the same."""

import io
import json
from collections import defaultdict, deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List

from transformers import TrainerControl, TrainerState

from posttrain.entrypoints.evaluation import results, scoring
from posttrain.entrypoints.records.samples import SAMPLES_FILE, SAMPLES_PER_LOG, RolloutSamples


def trl_logs(rollouts: int, extra: bool) -> Dict[str, Any]:
    """What GRPO/RLOO keep of their latest generation batch, as they keep it (deques, extra columns by name)."""
    logs: Dict[str, Any] = {
        "prompt": deque(f"prompt {i}" for i in range(rollouts)),
        "completion": deque(f"completion {i}" for i in range(rollouts)),
        "rewards": defaultdict(deque, {"code_tests": deque(float(i % 2) for i in range(rollouts))}),
        "advantages": deque(i / 10 for i in range(rollouts)),
        "extra": defaultdict(deque),
    }
    if extra:
        logs["extra"]["code_tests/tests"] = deque("" if i % 2 else f"tests line 1: failed {i}" for i in range(rollouts))
    return logs


def test_each_sample_keeps_what_the_rewards_logged_of_it(tmp_path: Path) -> None:
    trainer = SimpleNamespace(_logs=trl_logs(rollouts=6, extra=True))
    callback = RolloutSamples(trainer, tmp_path)
    callback.on_log(None, TrainerState(global_step=3), TrainerControl(), logs={"loss": 1.0})
    samples = [json.loads(line) for line in (tmp_path / SAMPLES_FILE).read_text().splitlines()]
    assert len(samples) == SAMPLES_PER_LOG == 4
    # the batch's last four, each with its own score and its own line of the extra column
    assert [sample["completion"] for sample in samples] == [f"completion {i}" for i in range(2, 6)]
    assert [sample["rewards"]["code_tests"] for sample in samples] == [0.0, 1.0, 0.0, 1.0]
    assert [sample["extra"] for sample in samples] == [
        {"code_tests/tests": "tests line 1: failed 2"},
        {"code_tests/tests": ""},
        {"code_tests/tests": "tests line 1: failed 4"},
        {"code_tests/tests": ""},
    ]


def test_a_run_whose_rewards_logged_nothing_writes_no_extra(tmp_path: Path) -> None:
    trainer = SimpleNamespace(_logs=trl_logs(rollouts=2, extra=False))
    RolloutSamples(trainer, tmp_path).on_log(None, TrainerState(global_step=1), TrainerControl(), logs={"loss": 1.0})
    samples = [json.loads(line) for line in (tmp_path / SAMPLES_FILE).read_text().splitlines()]
    assert len(samples) == 2 and all("extra" not in sample for sample in samples)


def test_an_evaluations_result_keeps_what_its_scorers_logged_and_a_scorer_without_log_extra_is_called_without() -> None:
    def logging(prompts: List[Any], completions: List[Any], **columns: Any) -> List[float]:
        columns["log_extra"]("code_tests/tests", [f"why {text}" for text in completions])
        return [0.0] * len(completions)

    def strict(prompts: List[Any], completions: List[Any], answer: List[str]) -> List[float]:
        return [float(text == want) for text, want in zip(completions, answer)]

    part = io.StringIO()
    row = {"prompt": "p", "answer": "a"}
    results.write(part, scoring.result("base", 0, row, ["a", "b"], {"logging": logging, "strict": strict}))
    result = json.loads(part.getvalue())
    assert result["scores"] == {"logging": [0.0, 0.0], "strict": [1.0, 0.0]}
    assert result["extra"] == {"code_tests/tests": ["why a", "why b"]}


def test_a_resumed_run_keeps_the_samples_up_to_its_checkpoint_s_step(tmp_path: Path) -> None:
    (tmp_path / SAMPLES_FILE).write_text(
        "".join(json.dumps({"step": step, "prompt": "p"}) + "\n" for step in (1, 2, 3, 4)) + '{"step": 5, "pro'
    )
    callback = RolloutSamples(SimpleNamespace(), tmp_path)
    callback.on_train_begin(None, TrainerState(global_step=2), TrainerControl())
    assert [json.loads(line)["step"] for line in (tmp_path / SAMPLES_FILE).read_text().splitlines()] == [1, 2]
