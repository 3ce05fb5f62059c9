"""PPO on a model shaped like a real one (``builtin:tiny-llama3``) with ``report_to: tensorboard`` records its own
logs."""

from pathlib import Path

from ppo_setup import length, make_trainer


def test_report_to_tensorboard_records_ppos_logs(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = make_trainer(tmp_path, [length], report_to=["tensorboard"])
    trainer.train()
    # transformers' default: output_dir/runs/<date>_<host>
    (runs,) = (tmp_path / "runs").iterdir()
    events = EventAccumulator(str(runs))
    events.Reload()
    assert {"train/objective/scores", "train/objective/kl", "train/loss/policy"} <= set(events.Tags()["scalars"])
