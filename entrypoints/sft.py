"""Supervised fine-tuning with ``trl.SFTTrainer``, as TRL's ``trl/scripts/sft.py``.

What it reads, loads, logs, saves and refuses, and how to run it: its description in components/spec/descriptions.py,
shown by ``torchx run posttrain.sft --help`` and on docs/pages/reference/sft.md.
"""

from trl import SFTTrainer

from posttrain.entrypoints.job.runtime import Job, main


def build_trainer(job: Job) -> SFTTrainer:
    model = job.load_model()
    return SFTTrainer(
        model=model,
        args=job.args,
        data_collator=job.data_collator(model),
        train_dataset=job.train_dataset,
        eval_dataset=job.eval_dataset,
        processing_class=job.tokenizer,
        peft_config=job.peft_config,
        callbacks=job.callbacks,
    )


if __name__ == "__main__":
    main("sft", build_trainer)
