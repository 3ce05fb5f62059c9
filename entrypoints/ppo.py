"""PPO with posttrain's own trainer (``posttrain.entrypoints.ppo_trainer``).

    torchx run -s local_cwd posttrain.ppo --spec templates/ppo/tiny.yaml
"""

from transformers import AutoModelForSequenceClassification

from posttrain.entrypoints.ppo_trainer import PPOTrainer
from posttrain.entrypoints.runtime import Job, load_model, run


def build_trainer(job: Job) -> PPOTrainer:
    spec = job.spec
    reward_models = [reward.model for reward in spec.rewards if reward.model is not None]
    # the reward model knows what good looks like: the usual start for the critic
    value_init = spec.value_model or (reward_models[0] if len(reward_models) == 1 else spec.model.name_or_path)
    return PPOTrainer(
        policy=job.load_model(),
        ref_policy=job.load_reference_model(),
        value_model=load_model(value_init, spec, job.tokenizer, AutoModelForSequenceClassification),
        rewards=job.rewards,
        reward_weights=[reward.weight for reward in spec.rewards],
        args=job.args,
        train_dataset=job.train_dataset,
        processing_class=job.tokenizer,
        callbacks=job.callbacks,
    )


if __name__ == "__main__":
    run("ppo", build_trainer)
