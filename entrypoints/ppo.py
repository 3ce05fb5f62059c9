"""PPO with posttrain's own trainer (``trainers/ppo_trainer.py``; TRL 1.x has none).

What it reads, loads, logs, saves and refuses, and how to run it: its description in components/spec/descriptions.py,
shown by ``torchx run posttrain.ppo --help`` and on docs/pages/reference/ppo.md.
"""

from posttrain.entrypoints.job.runtime import Job, main
from posttrain.entrypoints.trainers.ppo_trainer import PPOTrainer


def build_trainer(job: Job) -> PPOTrainer:
    policy = job.load_model()
    ref_policy = job.load_extra_model("reference_model")
    value_model = job.load_extra_model("value_model")
    reward_funcs, reward_tokenizers = job.load_rewards()
    return PPOTrainer(
        policy=policy,
        ref_policy=ref_policy,
        value_model=value_model,
        reward_funcs=reward_funcs,
        reward_processing_classes=reward_tokenizers,
        reward_weights=job.reward_weights,
        args=job.args,
        train_dataset=job.train_dataset,
        processing_class=job.tokenizer,
        callbacks=job.callbacks,
    )


if __name__ == "__main__":
    main("ppo", build_trainer)
