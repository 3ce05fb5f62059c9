"""Kahneman-Tversky optimisation with ``trl.KTOTrainer``, as TRL's ``trl/scripts/kto.py``.

What it reads, loads, logs, saves and refuses, and how to run it: its description in components/spec/descriptions.py,
shown by ``torchx run posttrain.kto --help`` and on docs/pages/reference/kto.md.
"""

from trl import KTOTrainer

from posttrain.entrypoints.job.runtime import Job, main


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
    main("kto", build_trainer)
