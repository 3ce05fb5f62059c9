"""metrics.jsonl and curves.png: the callback, the figure and the plot command, in process (the command in a process
of its own: tests/integration; real runs: tests/e2e)."""

import doctest
from pathlib import Path
from typing import Any, Dict, List

import pytest
from transformers import TrainerControl, TrainerState

from helpers import assert_valid_png, lines
from posttrain.entrypoints.records import curves
from posttrain.entrypoints.records.metrics import MetricsLog

CLOSING = {"train_runtime": 9.0, "train_samples_per_second": 1.0, "train_steps_per_second": 1.0, "train_loss": 1.0}


def state(global_step: int = 0, rank0: bool = True, log_history: List[Dict[str, Any]] = ()) -> TrainerState:
    return TrainerState(
        global_step=global_step, epoch=global_step / 10, is_world_process_zero=rank0, log_history=list(log_history)
    )


def log_steps(callback: MetricsLog, trainer_state: TrainerState, steps: range) -> None:
    for step in steps:
        trainer_state.global_step, trainer_state.epoch = step, step / 10
        callback.on_log(None, trainer_state, TrainerControl(), logs={"loss": 5.0 - step / 10, "epoch": step / 10})


def test_curves_doctests() -> None:
    result = doctest.testmod(curves)
    assert result.failed == 0 and result.attempted > 0


def test_lines_are_written_as_logs_arrive(tmp_path: Path) -> None:
    callback, trainer_state = MetricsLog(tmp_path, "sft", "builtin:tiny-llama", 2), state()
    callback.on_train_begin(None, trainer_state, TrainerControl())
    assert callback.path.read_text() == ""
    log_steps(callback, trainer_state, range(1, 3))
    assert lines(callback.path) == [{"loss": 4.9, "epoch": 0.1, "step": 1}, {"loss": 4.8, "epoch": 0.2, "step": 2}]
    # evaluations keep their names; our PPO trainer's logs have no epoch: the state's is added
    callback.on_log(None, trainer_state, TrainerControl(), logs={"eval_loss": 4.7})
    callback.on_log(None, trainer_state, TrainerControl(), logs={"objective/scores": 0.5, "objective/kl": 0.01})
    assert lines(callback.path)[2:] == [
        {"eval_loss": 4.7, "epoch": 0.2, "step": 2},
        {"objective/scores": 0.5, "objective/kl": 0.01, "epoch": 0.2, "step": 2},
    ]


def test_the_closing_summary_is_not_a_line(tmp_path: Path) -> None:
    callback, trainer_state = MetricsLog(tmp_path, "sft", "m", 1), state()
    callback.on_train_begin(None, trainer_state, TrainerControl())
    log_steps(callback, trainer_state, range(1, 3))
    # per-step logs carry train_runtime too (speed metrics): only the closing summary is left out
    callback.on_log(None, trainer_state, TrainerControl(), logs={"loss": 1.0, "train_runtime": 3.0})
    callback.on_log(None, trainer_state, TrainerControl(), logs=dict(CLOSING))
    assert [record.get("train_runtime") for record in lines(callback.path)] == [None, None, 3.0]


def test_only_rank_0_writes(tmp_path: Path) -> None:
    callback, trainer_state = MetricsLog(tmp_path / "out", "sft", "m", 2), state(rank0=False)
    callback.on_train_begin(None, trainer_state, TrainerControl())
    log_steps(callback, trainer_state, range(1, 4))
    callback.on_train_end(None, trainer_state, TrainerControl())
    assert not (tmp_path / "out").exists()


def test_a_resume_keeps_the_checkpoints_steps_and_continues(tmp_path: Path) -> None:
    crashed = MetricsLog(tmp_path, "sft", "m", 2)
    crashed.on_train_begin(None, state(), TrainerControl())
    log_steps(crashed, state(), range(1, 26))
    with crashed.path.open("a") as file:
        # the crash tore the last line
        file.write('{"loss": 1.2, "ep')
    resumed, trainer_state = MetricsLog(tmp_path, "sft", "m", 2), state(global_step=20)
    resumed.on_train_begin(None, trainer_state, TrainerControl())
    assert [record["step"] for record in lines(resumed.path)] == list(range(1, 21))
    log_steps(resumed, trainer_state, range(21, 31))
    records = lines(resumed.path)
    assert [record["step"] for record in records] == list(range(1, 31))
    assert records[20] == {"loss": 5.0 - 2.1, "epoch": 2.1, "step": 21}


def test_a_fresh_start_empties_an_old_file(tmp_path: Path) -> None:
    (tmp_path / curves.METRICS_FILE).write_text('{"loss": 1.0, "step": 1}\n')
    callback = MetricsLog(tmp_path, "sft", "m", 1)
    callback.on_train_begin(None, state(), TrainerControl())
    assert callback.path.read_text() == ""


def test_a_resume_without_the_file_starts_it_from_the_checkpoints_history(tmp_path: Path) -> None:
    history = [{"loss": 2.0, "epoch": 0.1, "step": 1}, {"loss": 1.0, "epoch": 0.2, "step": 2}]
    callback = MetricsLog(tmp_path / "new", "sft", "m", 1)
    callback.on_train_begin(None, state(global_step=2, log_history=history + [dict(CLOSING, step=2)]), TrainerControl())
    assert lines(callback.path) == history


def test_the_end_of_training_draws_the_logged_curves(tmp_path: Path) -> None:
    callback, trainer_state = MetricsLog(tmp_path / "dpo-run", "dpo", "builtin:tiny-llama", 2), state()
    callback.on_train_begin(None, trainer_state, TrainerControl())
    for step in range(1, 6):
        trainer_state.global_step = step
        logs = {"loss": 1 / step, "rewards/margins": step / 10, "rewards/accuracies": 0.5, "learning_rate": 1e-3}
        callback.on_log(None, trainer_state, TrainerControl(), logs={**logs, "grad_norm": 3.0})
    callback.on_log(None, trainer_state, TrainerControl(), logs={"eval_loss": 0.3, "eval_runtime": 0.1})
    callback.on_train_end(None, trainer_state, TrainerControl())
    data = assert_valid_png(tmp_path / "dpo-run" / curves.CURVES_FILE)
    assert data["title"] == "dpo · builtin:tiny-llama · 2 processes"
    drawn = data["runs"]["dpo-run"]
    assert list(drawn) == ["loss", "eval_loss", "rewards/margins", "rewards/accuracies", "learning_rate"]
    assert drawn == curves.series(lines(callback.path))
    assert drawn["loss"] == {"step": [1, 2, 3, 4, 5], "value": [1.0, 0.5, 1 / 3, 0.25, 0.2]}
    assert not list((tmp_path / "dpo-run").glob("*.tmp"))


def test_a_figure_that_cannot_be_drawn_does_not_fail_the_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # on_train_begin never ran: no directory, no file
    callback = MetricsLog(tmp_path / "gone", "sft", "m", 1)
    callback.on_train_end(None, state(), TrainerControl())
    assert "could not draw curves.png" in caplog.text


# ---------------------------------------------------------------- real runs
