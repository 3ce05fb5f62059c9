"""Group relative policy optimisation with ``trl.GRPOTrainer``, as TRL's ``trl/scripts/grpo.py``; GSPO is
``importance_sampling_level: sequence``.

    torchx run -s local_cwd posttrain.grpo --spec templates/grpo/tiny.yaml
    torchx run -s local_cwd posttrain.grpo --spec templates/grpo/gspo-tiny.yaml

Data: ``prompt`` rows. Each prompt gets ``num_generations`` completions, scored by the spec's ``rewards``
(functions, built-ins and reward models, weighted) and compared within their group. Generation: transformers'
``generate``, or vLLM (``use_vllm``; ``vllm_mode: server`` adds the job's ``vllm`` role).
Logs: ``reward``, ``reward_std``, ``rewards/<name>/mean``, ``kl`` (with ``beta`` > 0), ``entropy``,
``completions/mean_length``, ``clip_ratio/*``. Every reward's scores are checked at each step's end
(``rewards.RewardCheck``): a NaN or a wrong count stops the job with one line.
"""

from trl import GRPOTrainer

from posttrain.entrypoints.job.runtime import Job, run


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
    )


if __name__ == "__main__":
    run("grpo", build_trainer)
