"""Kahneman-Tversky optimisation on unpaired good/bad labels with ``trl.KTOTrainer``.

    torchx run -s local_cwd posttrain.kto --spec templates/kto/tiny.yaml
"""

from trl import KTOTrainer

from posttrain.entrypoints.runtime import Job, run


def build_trainer(job: Job) -> KTOTrainer:
    return KTOTrainer(
        model=job.load_model(),
        ref_model=job.load_reference_model(),
        **job.trainer_kwargs,
    )


if __name__ == "__main__":
    run("kto", build_trainer)
