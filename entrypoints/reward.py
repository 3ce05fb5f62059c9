"""Reward modelling with ``trl.RewardTrainer``, as TRL's ``trl/scripts/reward.py``: a sequence-classification head
learns to score the chosen answer above the rejected one.

    torchx run -s local_cwd posttrain.reward --spec templates/reward/tiny.yaml

Data: ``prompt``, ``chosen`` and ``rejected`` rows (or ``chosen`` and ``rejected`` alone).
The model is loaded with ``AutoModelForSequenceClassification`` (one label); LoRA trains it as ``SEQ_CLS``.
Logs: ``loss``, ``accuracy``, ``margin``, ``mean_reward``, ``min_reward``, ``max_reward``.
"""

from trl import RewardTrainer

from posttrain.entrypoints.job.runtime import Job, run


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
    run("reward", build_trainer)
