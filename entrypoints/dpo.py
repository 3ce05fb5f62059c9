"""Direct preference optimisation with ``trl.DPOTrainer``, as TRL's ``trl/scripts/dpo.py``.

What it reads, loads, logs, saves and refuses, and how to run it: its description in components/spec/descriptions.py,
shown by ``torchx run posttrain.dpo --help`` and on docs/pages/reference/dpo.md.
"""

from trl import DPOTrainer

from posttrain.entrypoints.job.runtime import Job, main


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
    main("dpo", build_trainer)
