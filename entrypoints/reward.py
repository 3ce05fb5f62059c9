"""Reward modelling with ``trl.RewardTrainer``, as TRL's ``trl/scripts/reward.py``.

What it reads, loads, logs, saves and refuses, and how to run it: its description in components/spec/descriptions.py,
shown by ``torchx run posttrain.reward --help`` and on docs/pages/reference/reward.md.
"""

from trl import RewardTrainer

from posttrain.entrypoints.job.runtime import Job, main


def build_trainer(job: Job) -> RewardTrainer:
    return RewardTrainer(
        model=job.load_model(),
        args=job.args,
        train_dataset=job.train_dataset,
        eval_dataset=job.eval_dataset,
        processing_class=job.tokenizer,
        peft_config=job.peft_config,
        callbacks=job.callbacks,
    )


if __name__ == "__main__":
    main("reward", build_trainer)
