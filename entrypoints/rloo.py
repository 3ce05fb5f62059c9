"""REINFORCE leave-one-out with ``trl.RLOOTrainer``.

    torchx run -s local_cwd posttrain.rloo --spec templates/rloo/tiny.yaml
"""

from trl import RLOOTrainer

from posttrain.entrypoints.runtime import Job, run


def build_trainer(job: Job) -> RLOOTrainer:
    return RLOOTrainer(model=job.load_model(), reward_funcs=job.rewards, **job.trainer_kwargs)


if __name__ == "__main__":
    run("rloo", build_trainer)
