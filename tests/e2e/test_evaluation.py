"""The evaluation's settings the job checks at the first evaluation, on every rank of a real two-process job."""

from pathlib import Path

import pytest

from helpers import (
    assert_stopped_once,
    run_template,
)

pytestmark = pytest.mark.usefixtures("job_process")


@pytest.mark.e2e
def test_e2e_every_rank_stops_at_the_first_evaluation_with_one_line(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    result = run_template(
        "sft/tiny.yaml",
        tmp_path,
        output_dir,
        overrides=[
            "data.eval.path=templates/data/sft_chat.jsonl",
            "training.eval_strategy=steps",
            "training.eval_steps=20",
            "training.eval_on_start=true",
            "training.metric_for_best_model=accuracy",
        ],
    )
    message = "training.metric_for_best_model: accuracy is not among the metrics the evaluation returns"
    assert_stopped_once(result, message)
    assert not list(output_dir.glob("checkpoint-*"))
