"""Group relative policy optimisation with ``trl.GRPOTrainer``; GSPO is ``importance_sampling_level: sequence``.

    torchx run -s local_cwd posttrain.grpo --spec templates/grpo/tiny.yaml
    torchx run -s local_cwd posttrain.grpo --spec templates/grpo/gspo-tiny.yaml
"""

from trl import GRPOTrainer

from posttrain.entrypoints.runtime import Job, run


def build_trainer(job: Job) -> GRPOTrainer:
    return GRPOTrainer(model=job.load_model(), reward_funcs=job.rewards, **job.trainer_kwargs)


if __name__ == "__main__":
    run("grpo", build_trainer)
