"""The evaluation's settings the job checks where they can first be known: at the first evaluation."""

import dataclasses
import json
from pathlib import Path
from typing import Any, Dict

import pytest

from helpers import (
    load_template,
    read_json,
    refusal,
    run_entrypoint,
    stopped_in_process,
    tiny_job,
    trainer_with,
)
from posttrain.components.spec.loading import validate

pytestmark = pytest.mark.usefixtures("job_process")


def sft_with_evaluation(tmp_path: Path, **training: Any) -> str:
    """The tiny SFT's spec, as the job gets it, evaluating every 2 of 4 steps into ``tmp_path/out``."""
    raw = load_template("sft/tiny.yaml")
    raw["data"]["eval"] = {"path": "templates/data/sft_chat.jsonl"}
    raw["training"].update(
        output_dir=str(tmp_path / "out"), max_steps=4, eval_strategy="steps", eval_steps=2, save_steps=2, **training
    )
    return validate(raw).to_json()


def run_sft(tmp_path: Path, **training: Any) -> Path:
    run_entrypoint("sft", sft_with_evaluation(tmp_path, **training))
    return tmp_path / "out"


def logged(output_dir: Path) -> list:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_best_model_metric_the_evaluation_does_not_return_is_one_line_before_any_step(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # transformers raised a KeyError after the first evaluation, as a traceback, eval_steps into training
    err = stopped_in_process(
        "sft", sft_with_evaluation(tmp_path, metric_for_best_model="accuracy", eval_on_start=True), capsys
    )
    assert (
        err.count(
            "posttrain: training.metric_for_best_model: accuracy is not among the metrics the evaluation "
            "returns (eval_entropy, eval_loss, eval_mean_token_accuracy, "
        )
        == 1
    ), err
    assert "Traceback" not in err
    # not one training step
    assert not any("loss" in entry for entry in logged(tmp_path / "out"))
    assert not list((tmp_path / "out").glob("checkpoint-*"))


def test_without_eval_on_start_it_stops_at_the_first_evaluation(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    spec_json = sft_with_evaluation(tmp_path, metric_for_best_model="eval_rewards/margins", load_best_model_at_end=True)
    err = stopped_in_process("sft", spec_json, capsys)
    assert err.count("posttrain: training.metric_for_best_model: eval_rewards/margins is not") == 1
    steps = [entry["step"] for entry in logged(tmp_path / "out") if "loss" in entry]
    assert steps == [1, 2]


def test_a_metric_the_evaluation_returns_picks_the_best_checkpoint(tmp_path: Path) -> None:
    output_dir = run_sft(tmp_path, metric_for_best_model="mean_token_accuracy", load_best_model_at_end=True)
    state: Dict[str, Any] = read_json(output_dir / "checkpoint-4" / "trainer_state.json")
    evaluations = [entry for entry in state["log_history"] if "eval_mean_token_accuracy" in entry]
    assert [entry["step"] for entry in evaluations] == [2, 4]
    best = max(evaluations, key=lambda entry: entry["eval_mean_token_accuracy"])
    assert state["best_metric"] == best["eval_mean_token_accuracy"]
    assert state["best_model_checkpoint"].endswith(f"checkpoint-{best['step']}")


def test_the_best_checkpoint_needs_scheduled_evaluations(tmp_path: Path) -> None:
    job = tiny_job(tmp_path, "sft")
    job = dataclasses.replace(job, eval_dataset=job.train_dataset.select(range(16)))
    # what transformers did with eval_strategy no (TRL's default), eval_on_start's evaluation or not: it compared no
    # metric, and save_strategy best saved no checkpoint at all
    for on_start in (False, True):
        trainer = trainer_with(
            job,
            max_steps=4,
            save_strategy="best",
            metric_for_best_model="loss",
            greater_is_better=False,
            eval_on_start=on_start,
        )
        trainer.train()
        assert trainer.state.best_metric is None and not list((tmp_path / "out").glob("checkpoint-*"))
    assert refusal(job, save_strategy="best", metric_for_best_model="eval_loss").startswith(
        "training.save_strategy: best cannot go with eval_strategy: 'no' (TRL's default); expected 'no' or steps or "
        "epoch (best saves a checkpoint when an evaluation"
    )
    for key, value in (
        ("metric_for_best_model", "eval_loss"),
        ("greater_is_better", False),
        ("load_best_model_at_end", True),
    ):
        assert refusal(job, **{key: value}).startswith(
            f"training.{key}: {str(value).lower()} does nothing with eval_strategy: 'no'"
        )


# what transformers' evaluation reads only for a compute_metrics function, which posttrain gives no trainer
FOR_COMPUTE_METRICS = {
    "batch_eval_metrics": True,
    "include_for_metrics": ["inputs", "loss"],
    "eval_do_concat_batches": False,
    "prediction_loss_only": False,
}


@pytest.mark.parametrize("algorithm", ["sft", "dpo", "grpo"])
def test_options_for_compute_metrics_are_refused_and_change_no_evaluation(tmp_path: Path, algorithm: str) -> None:
    job = tiny_job(tmp_path, algorithm)
    for key, value in FOR_COMPUTE_METRICS.items():
        message = refusal(job, **{key: value})
        assert f"training.{key}: " in message and "does nothing" in message, message
    job = dataclasses.replace(job, eval_dataset=job.train_dataset.select(range(16)))

    def evaluated(**training: Any) -> Dict[str, float]:
        # the trainer seeds itself
        metrics = trainer_with(job, **training).evaluate()
        return {key: value for key, value in metrics.items() if "time" not in key and "per_second" not in key}

    options = FOR_COMPUTE_METRICS
    # its batches are lists of prompts: transformers failed to gather the inputs
    if algorithm == "grpo":
        with pytest.raises(TypeError, match="list indices must be integers or slices, not str"):
            evaluated(include_for_metrics=["inputs"])
        options = {**options, "include_for_metrics": ["loss"]}
    assert evaluated(**options) == evaluated()
