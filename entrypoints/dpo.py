"""Direct preference optimisation with ``trl.DPOTrainer``.

    torchx run -s local_cwd posttrain.dpo --spec templates/dpo/tiny.yaml
"""

from trl import DPOTrainer

from posttrain.entrypoints.runtime import Job, run


def build_trainer(job: Job) -> DPOTrainer:
    return DPOTrainer(
        model=job.load_model(),
        ref_model=job.load_reference_model(),
        **job.trainer_kwargs,
    )


if __name__ == "__main__":
    run("dpo", build_trainer)
