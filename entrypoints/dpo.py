"""Direct preference optimisation with ``trl.DPOTrainer``, as TRL's ``trl/scripts/dpo.py``.

    torchx run -s local_cwd posttrain.dpo --spec templates/dpo/tiny.yaml

Data: ``prompt``, ``chosen`` and ``rejected`` rows (or ``chosen`` and ``rejected`` alone).
The reference: ``reference_model``, else a second load of the model (under LoRA: the model, adapter off).
Logs: ``loss``, ``rewards/chosen``, ``rewards/rejected``, ``rewards/accuracies``, ``rewards/margins``,
``logps/chosen``, ``logps/rejected``, ``logits/chosen``, ``logits/rejected``.
Refused: ``padding_free`` (TRL 1.16's DPOTrainer turns it off).
"""

from trl import DPOTrainer

from posttrain.entrypoints.job.runtime import Job, run


def build_trainer(job: Job) -> DPOTrainer:
    return DPOTrainer(
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
    run("dpo", build_trainer)
