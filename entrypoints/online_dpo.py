"""Online DPO with ``trl.experimental.online_dpo.OnlineDPOTrainer``: preference pairs sampled and scored as it
trains.

    torchx run -s local_cwd posttrain.online_dpo --spec templates/online_dpo/tiny.yaml

Data: ``prompt`` rows. Two completions of each prompt are sampled and scored by the spec's ``rewards``; DPO's loss
prefers the better one against the reference (``reference_model``, else a second load of the model). Generation:
transformers' ``generate``, or vLLM (``use_vllm``; ``vllm_mode: server`` adds the job's ``vllm`` role).
Logs: ``loss``, ``objective/scores``, ``objective/scores_margin``, ``objective/kl``, ``objective/entropy``,
``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``. Refused: evaluation (``data.eval``, ``eval_*``:
TRL's trainer runs the model's forward on prompt rows, which fails), ``remove_unused_columns`` (false, TRL's
default, is what its prompt rows need), ``reward_model_path`` (use ``rewards: [{model: ...}]``).
"""

from trl.experimental.online_dpo import OnlineDPOTrainer

from posttrain.entrypoints.job.runtime import Job, run


def build_trainer(job: Job) -> OnlineDPOTrainer:
    model = job.load_model()
    ref_model = job.load_extra_model("reference_model")
    reward_funcs, reward_processing_classes = job.load_rewards()
    return OnlineDPOTrainer(
        model=model,
        ref_model=ref_model,
        reward_funcs=reward_funcs,
        args=job.args,
        train_dataset=job.train_dataset,
        eval_dataset=job.eval_dataset,
        processing_class=job.tokenizer,
        reward_processing_classes=reward_processing_classes,
        peft_config=job.peft_config,
        callbacks=job.callbacks,
    )


if __name__ == "__main__":
    run("online_dpo", build_trainer)
