"""Odds-ratio preference optimisation with ``trl.experimental.orpo.ORPOTrainer``: SFT and preference in one loss,
no reference model.

    torchx run -s local_cwd posttrain.orpo --spec templates/orpo/tiny.yaml

Data: ``prompt``, ``chosen`` and ``rejected`` rows (or ``chosen`` and ``rejected`` alone).
Logs: ``loss``, ``nll_loss``, ``log_odds_ratio``, ``log_odds_chosen``, ``rewards/chosen``, ``rewards/rejected``,
``rewards/accuracies``, ``rewards/margins``.
Refused: ``remove_unused_columns`` (ORPO's collator needs every column; posttrain sets it to false).
"""

from trl.experimental.orpo import ORPOTrainer

from posttrain.entrypoints.job.runtime import Job, run


def build_trainer(job: Job) -> ORPOTrainer:
    return ORPOTrainer(
        model=job.load_model(),
        args=job.args,
        train_dataset=job.train_dataset,
        eval_dataset=job.eval_dataset,
        processing_class=job.tokenizer,
        peft_config=job.peft_config,
        callbacks=job.callbacks,
    )


if __name__ == "__main__":
    run("orpo", build_trainer)
