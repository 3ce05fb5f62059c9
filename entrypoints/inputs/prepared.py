"""What TRL's preparation of the data kept: rows that do not fit ``max_length`` are dropped without a word."""

import logging
from typing import Any, Optional

from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.process.distributed import env_rank

log = logging.getLogger("posttrain")


def check_kept_rows(trainer: Any, train_dataset: Any, eval_dataset: Optional[Any]) -> None:
    """What the trainer kept of each data set: TRL's preparation drops the rows that cannot fit max_length (reward:
    a pair longer than it; DPO and KTO: a prompt that fills it) and says nothing. Rank 0 says how many it dropped;
    none kept is an error, before the first step. (A generating trainer's prompts are not prepared: not called.)"""
    # packing joins rows
    if getattr(trainer.args, "packing", False):
        return
    loaded = (("data.train", train_dataset, trainer.train_dataset), ("data.eval", eval_dataset, trainer.eval_dataset))
    for where, dataset, kept in loaded:
        if dataset is None:
            continue
        rows, left = len(dataset), len(kept)
        if left == 0:
            raise SpecError(
                [
                    f"{where}: the trainer dropped all {rows} rows, none fitting max_length "
                    f"({trainer.args.max_length} tokens); raise max_length"
                ]
            )
        if left < rows and env_rank() == 0:
            log.warning(
                "%s: the trainer kept %d of %d rows, dropping those that do not fit max_length (%s tokens); "
                "raise max_length to keep them",
                where,
                left,
                rows,
                trainer.args.max_length,
            )
