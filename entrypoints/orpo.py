"""Odds-ratio preference optimisation with ``trl.experimental.orpo.ORPOTrainer``.

What it reads, loads, logs, saves and refuses, and how to run it: its description in components/spec/descriptions.py,
shown by ``torchx run posttrain.orpo --help`` and on docs/pages/reference/orpo.md.
"""

from trl.experimental.orpo import ORPOTrainer

from posttrain.entrypoints.job.runtime import Job, main


def build_trainer(job: Job) -> ORPOTrainer:
    return ORPOTrainer(
        model=job.load_model(),
        args=job.args,
        train_dataset=job.train_dataset,
        eval_dataset=job.eval_dataset,
        processing_class=job.tokenizer,
        peft_config=job.peft_config,
        callbacks=job.callbacks,
    )


if __name__ == "__main__":
    main("orpo", build_trainer)
