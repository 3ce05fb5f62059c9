"""Supervised fine-tuning with ``trl.SFTTrainer``, as TRL's ``trl/scripts/sft.py``.

    torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml

Data: ``messages`` (chat), ``text``, or ``prompt`` and ``completion`` rows.
Logs: ``loss``, ``entropy``, ``mean_token_accuracy``, ``num_tokens``.
Fast paths where the spec leaves their keys unset (``fast_paths.py``): padding-free batches, Liger kernels on GPUs,
no activation checkpointing. Refused: ``dataset_kwargs`` (the trainer tokenizes the rows itself);
``dataset_text_field`` is posttrain's (map a column with ``data.columns``).
"""

from trl import SFTTrainer

from posttrain.entrypoints.job.runtime import Job, run


def build_trainer(job: Job) -> SFTTrainer:
    return SFTTrainer(
        model=job.load_model(),
        args=job.args,
        train_dataset=job.train_dataset,
        eval_dataset=job.eval_dataset,
        processing_class=job.tokenizer,
        peft_config=job.peft_config,
        callbacks=job.callbacks,
    )


if __name__ == "__main__":
    run("sft", build_trainer)
