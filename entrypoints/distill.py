"""On-policy distillation of ``teacher_model`` into the model with ``trl.DistillationTrainer``.

What it reads, loads, logs, saves and refuses, and how to run it: its description in components/spec/descriptions.py,
shown by ``torchx run posttrain.distill --help`` and on docs/pages/reference/distill.md.
"""

from trl import DistillationTrainer

from posttrain.entrypoints.job.runtime import Job, main


def build_trainer(job: Job) -> DistillationTrainer:
    return DistillationTrainer(
        model=job.load_model(),
        teacher_model=job.load_extra_model("teacher_model"),
        args=job.args,
        train_dataset=job.train_dataset,
        eval_dataset=job.eval_dataset,
        processing_class=job.tokenizer,
        callbacks=job.callbacks,
        peft_config=job.peft_config,
    )


if __name__ == "__main__":
    main("distill", build_trainer)
