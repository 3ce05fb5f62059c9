"""Reward modelling: a sequence-classification head scoring chosen above rejected (``trl.RewardTrainer``).

    torchx run -s local_cwd posttrain.reward --spec templates/reward/tiny.yaml
"""

from transformers import AutoModelForSequenceClassification
from trl import RewardTrainer

from posttrain.entrypoints.runtime import Job, run


def build_trainer(job: Job) -> RewardTrainer:
    return RewardTrainer(model=job.load_model(AutoModelForSequenceClassification), **job.trainer_kwargs)


if __name__ == "__main__":
    run("reward", build_trainer)
