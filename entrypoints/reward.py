"""Reward modelling: a sequence-classification head scoring chosen above rejected (``trl.RewardTrainer``).

torchx run -s local_cwd posttrain.reward --spec templates/reward/tiny.yaml
"""

from posttrain.entrypoints.runtime import run

if __name__ == "__main__":
    run("reward")
