"""Online DPO with ``trl.experimental.online_dpo.OnlineDPOTrainer``.

What it reads, loads, logs, saves and refuses, and how to run it: its description in components/spec/descriptions.py,
shown by ``torchx run posttrain.online_dpo --help`` and on docs/pages/reference/online_dpo.md.
"""

from trl.experimental.online_dpo import OnlineDPOTrainer

from posttrain.entrypoints.job.runtime import Job, main


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
    main("online_dpo", build_trainer)
