"""Kahneman-Tversky optimisation on unpaired good and bad answers with ``trl.KTOTrainer``, as TRL's
``trl/scripts/kto.py``.

    torchx run -s local_cwd posttrain.kto --spec templates/kto/tiny.yaml

Data: ``prompt``, ``completion`` and ``label`` (true: desirable) rows.
The reference: ``reference_model``, else a second load of the model (under LoRA: the model, adapter off).
Logs: ``loss``, ``kl``, ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``, ``logps/chosen``,
``logps/rejected``.
"""

from trl import KTOTrainer

from posttrain.entrypoints.job.runtime import Job, run


def build_trainer(job: Job) -> KTOTrainer:
    return KTOTrainer(
        model=job.load_model(),
        ref_model=job.load_extra_model("reference_model"),
        args=job.args,
        train_dataset=job.train_dataset,
        eval_dataset=job.eval_dataset,
        processing_class=job.tokenizer,
        peft_config=job.peft_config,
        callbacks=job.callbacks,
    )


if __name__ == "__main__":
    run("kto", build_trainer)
