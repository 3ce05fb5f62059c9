"""REINFORCE leave-one-out with ``trl.RLOOTrainer``, as TRL's ``trl/scripts/rloo.py``.

What it reads, loads, logs, saves and refuses, and how to run it: its description in components/spec/descriptions.py,
shown by ``torchx run posttrain.rloo --help`` and on docs/pages/reference/rloo.md.
"""

from trl import RLOOTrainer

from posttrain.entrypoints.job.runtime import Job, main


def build_trainer(job: Job) -> RLOOTrainer:
    model = job.load_model()
    reward_funcs, reward_processing_classes = job.load_rewards()
    return RLOOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=job.args,
        train_dataset=job.train_dataset,
        eval_dataset=job.eval_dataset,
        processing_class=job.tokenizer,
        reward_processing_classes=reward_processing_classes,
        callbacks=job.callbacks,
        peft_config=job.peft_config,
    )


if __name__ == "__main__":
    main("rloo", build_trainer)
