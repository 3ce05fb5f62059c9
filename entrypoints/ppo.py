"""PPO with posttrain's own trainer (``posttrain.entrypoints.ppo_trainer``).

torchx run -s local_cwd posttrain.ppo --spec templates/ppo/tiny.yaml
"""

from posttrain.entrypoints.ppo_trainer import PPOTrainer
from posttrain.entrypoints.runtime import Job, run


def build_trainer(job: Job) -> PPOTrainer:
    """The policy, then the reference and value models (the registry's extra_models), then the rewards."""
    policy = job.load_model()
    models = job.load_extra_models()  # ref_policy, value_model
    reward_funcs, reward_tokenizers = job.load_rewards()
    return PPOTrainer(
        policy=policy,
        **models,
        reward_funcs=reward_funcs,
        reward_processing_classes=reward_tokenizers,
        reward_weights=[reward.weight for reward in job.spec.rewards],
        args=job.args,
        train_dataset=job.train_dataset,
        processing_class=job.tokenizer,
        callbacks=job.callbacks,
    )


if __name__ == "__main__":
    run("ppo", build_trainer)
