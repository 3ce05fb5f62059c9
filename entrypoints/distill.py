"""On-policy distillation of ``teacher_model`` into the model with ``trl.DistillationTrainer``.

    torchx run -s local_cwd posttrain.distill --spec templates/distill/tiny.yaml

Data: ``prompt`` rows. The student generates completions; the loss is the generalised Jensen-Shannon divergence
(``beta``) between its and the teacher's next-token distributions on them. The teacher is loaded like the model
(same dtype and options), frozen, and must share its tokenizer. Logs: ``loss``, ``entropy``,
``completions/mean_length``. Refused: ``teacher_model_name_or_path``, ``teacher_model_revision`` and
``teacher_model_init_kwargs`` (posttrain's: use ``teacher_model`` at the top of the spec).
"""

from trl import DistillationTrainer

from posttrain.entrypoints.job.runtime import Job, run


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
    run("distill", build_trainer)
