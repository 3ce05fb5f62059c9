"""REINFORCE leave-one-out with ``trl.RLOOTrainer``, as TRL's ``trl/scripts/rloo.py``: each completion's baseline
is the mean reward of the other completions of its prompt.

    torchx run -s local_cwd posttrain.rloo --spec templates/rloo/tiny.yaml

Data: ``prompt`` rows; ``num_generations`` completions each, scored by the spec's ``rewards`` (functions, built-ins
and reward models, weighted). Generation: transformers' ``generate``, or vLLM (``use_vllm``; ``vllm_mode: server``
adds the job's ``vllm`` role).
Logs: ``reward``, ``reward_std``, ``rewards/<name>/mean``, ``kl`` (with ``beta`` > 0), ``entropy``,
``completions/mean_length``. Every reward's scores are checked at each step's end (``rewards.RewardCheck``).
"""

from trl import RLOOTrainer

from posttrain.entrypoints.job.runtime import Job, run


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
    run("rloo", build_trainer)
