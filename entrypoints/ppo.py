"""PPO with posttrain's own trainer (``posttrain.entrypoints.trainers.ppo_trainer``; TRL 1.x has none).

    torchx run -s local_cwd posttrain.ppo --spec templates/ppo/tiny.yaml

Data: ``prompt`` rows. Models: the policy; the frozen reference (``reference_model``, else a second load of the
policy); the value model (``value_model``, else the reward model where the rewards hold exactly one, else the
policy's weights with a fresh score head); the spec's ``rewards`` (reward models, functions, built-ins, weighted).
Logs: ``objective/scores``, ``objective/kl``, ``objective/kl_coef``, ``objective/non_score_reward``,
``objective/entropy``, ``loss/policy``, ``loss/value``, ``policy/approxkl``, ``policy/clipfrac``, ``val/clipfrac``,
``val/explained_variance``. Saves the policy and ``value_model/``. Refused: every field of ``PPOConfig`` the trainer
does not honour, each with its reason (``PPOSpec.refused_keys``).
"""

from posttrain.entrypoints.job.runtime import Job, run
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
        reward_weights=[reward.weight for reward in job.spec.rewards],
        args=job.args,
        train_dataset=job.train_dataset,
        processing_class=job.tokenizer,
        callbacks=job.callbacks,
    )


if __name__ == "__main__":
    run("ppo", build_trainer)
