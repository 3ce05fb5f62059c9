"""Supervised fine-tuning with ``trl.SFTTrainer``.

Run through the component (it validates and embeds the spec)::

    torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml
"""

from trl import SFTTrainer

from posttrain.entrypoints.runtime import Job, run


def build_trainer(job: Job) -> SFTTrainer:
    return SFTTrainer(model=job.load_model(), **job.trainer_kwargs)


if __name__ == "__main__":
    run("sft", build_trainer)
