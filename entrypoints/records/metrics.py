"""``metrics.jsonl`` and ``curves.png``: a run's logged metrics, as they come and as a figure at the end.

Rank 0 appends one JSON line per trainer log (the step, the epoch, the wall
clock ``time`` and every logged value, evaluations under their ``eval_``
names), flushed line by line
so a crashed run still leaves its history. The Trainer's closing summary
(``train_samples_per_second``, ...) is not a step and is left out. A resumed
run continues the file: at the start it keeps the lines up to the
checkpoint's step, dropping what the failed attempt logged after it, so no
step appears twice. At the end of training it draws ``curves.png`` with
:mod:`posttrain.entrypoints.records.curves` (``posttrain plot`` draws it from the
command line).
"""

import json
import logging
import time
from pathlib import Path
from typing import Any, Dict, Optional

from transformers import TrainerCallback

from posttrain.entrypoints.records.curves import CURVES_FILE, METRICS_FILE, draw, read_metrics, run_title, series
from posttrain.entrypoints.records.files import replacing

log = logging.getLogger("posttrain")

# Only the Trainer's closing summary logs this (its per-step logs carry train_runtime too).
CLOSING_KEY = "train_samples_per_second"


class MetricsLog(TrainerCallback):
    """Writes ``metrics.jsonl`` as the trainer logs and ``curves.png`` when training ends (rank 0 only)."""

    def __init__(self, output_dir: Path, algorithm: str, model: str, world_size: int) -> None:
        self.output_dir = Path(output_dir)
        self.path = self.output_dir / METRICS_FILE
        self.title = run_title(algorithm, model, world_size)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        if self.path.is_file():
            kept = [record for record in read_metrics(self.path) if record["step"] <= state.global_step]
        else:
            # resumed from a checkpoint elsewhere, or one written before this file existed
            kept = [entry for entry in state.log_history if CLOSING_KEY not in entry]
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with replacing(self.path) as temporary:
            temporary.write_text("".join(json.dumps(record) + "\n" for record in kept))

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Dict[str, Any]] = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs or CLOSING_KEY in logs:
            return
        entry = dict(logs)
        if state.epoch is not None:
            # the Trainer puts it in logs; our PPO trainer does not
            entry.setdefault("epoch", state.epoch)
        entry["step"] = state.global_step
        # seconds since the epoch: throughput and start-up read from the file
        entry["time"] = time.time()
        # closed, hence flushed, after every line
        with self.path.open("a") as file:
            file.write(json.dumps(entry) + "\n")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        try:
            draw([(self.output_dir.name, series(read_metrics(self.path)))], self.title, self.output_dir / CURVES_FILE)
        except Exception as error:
            # a figure must never cost the run its final save
            log.warning("could not draw %s: %s: %s", CURVES_FILE, type(error).__name__, error)
