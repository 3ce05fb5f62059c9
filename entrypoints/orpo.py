"""Odds-ratio preference optimisation, SFT and preference in one loss (``trl.experimental.orpo``).

    torchx run -s local_cwd posttrain.orpo --spec templates/orpo/tiny.yaml
"""

import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # ORPO lives in trl.experimental in TRL 1.x

from trl.experimental.orpo import ORPOTrainer  # noqa: E402

from posttrain.entrypoints.runtime import Job, run  # noqa: E402


def build_trainer(job: Job) -> ORPOTrainer:
    return ORPOTrainer(model=job.load_model(), **job.trainer_kwargs)


if __name__ == "__main__":
    run("orpo", build_trainer)
