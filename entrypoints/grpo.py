"""Group relative policy optimisation (and GSPO) with ``trl.GRPOTrainer``, as TRL's ``trl/scripts/grpo.py``.

What it reads, loads, logs, saves and refuses, and how to run it: its description in components/spec/descriptions.py,
shown by ``torchx run posttrain.grpo --help`` and on docs/pages/reference/grpo.md.
"""

from trl import GRPOTrainer

from posttrain.entrypoints.job.runtime import Job, main


def build_trainer(job: Job) -> GRPOTrainer:
    model = job.load_model()
    reward_funcs, reward_processing_classes = job.load_rewards()
    return GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=job.args,
        train_dataset=job.train_dataset,
        eval_dataset=job.eval_dataset,
        processing_class=job.tokenizer,
        reward_processing_classes=reward_processing_classes,
        callbacks=job.callbacks,
        peft_config=job.peft_config,
        tools=job.tools or None,
        environment_factory=job.environment_factory,
        rollout_func=job.rollouts,
    )


if __name__ == "__main__":
    main("grpo", build_trainer)
