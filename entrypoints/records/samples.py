"""``samples.jsonl``: a few whole rollouts of each logged step, so a user can see what the model did.

A line per rollout: the step, the prompt, the completion as the model and its tools wrote it (chat messages: the
calls, the tools' results, the answer; or text), each reward's score and the advantage, and what reward functions
logged of it through TRL's ``log_extra`` (``extra``: e.g. ``code_tests``' failure and stderr). Read from what TRL's
GRPO and RLOO trainers keep of their latest generation batch for their own completion tables (``_logs``, filled
whether or not ``log_completions`` prints them); a trainer that keeps none writes none.
"""

import json
from pathlib import Path
from typing import Any, Dict, Optional

from transformers import TrainerCallback

from posttrain.entrypoints.records.files import replacing
from posttrain.entrypoints.records.metrics import CLOSING_KEY

SAMPLES_FILE = "samples.jsonl"
# rollouts written per logged step: enough to see the model use its tools, few enough to read
SAMPLES_PER_LOG = 4


class RolloutSamples(TrainerCallback):
    """Appends the latest generation batch's last :data:`SAMPLES_PER_LOG` rollouts at each logged step (rank 0)."""

    def __init__(self, trainer: Any, output_dir: Path) -> None:
        self.trainer = trainer
        self.path = Path(output_dir) / SAMPLES_FILE

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A resumed run's file keeps the steps up to its checkpoint's, as ``metrics.jsonl`` does: the steps a killed
        attempt logged past it are trained again."""
        if not state.is_world_process_zero or not self.path.is_file():
            return
        lines = self.path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if _step(line) <= state.global_step]
        if len(kept) < len(lines):
            with replacing(self.path) as temporary:
                temporary.write_text("".join(kept))

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Dict[str, Any]] = None, **kwargs: Any) -> None:
        kept = getattr(self.trainer, "_logs", None)
        if not state.is_world_process_zero or not logs or CLOSING_KEY in logs or not kept or not kept["prompt"]:
            return
        count = min(SAMPLES_PER_LOG, len(kept["prompt"]))
        rewards = {name: list(scores)[-count:] for name, scores in kept["rewards"].items()}
        prompts, completions = list(kept["prompt"])[-count:], list(kept["completion"])[-count:]
        advantages = list(kept["advantages"])[-count:]
        extra = {column: list(values)[-count:] for column, values in kept.get("extra", {}).items()}
        lines = []
        for index, (prompt, completion) in enumerate(zip(prompts, completions)):
            sample = {
                "step": state.global_step,
                "prompt": prompt,
                "completion": completion,
                "rewards": {name: scores[index] for name, scores in rewards.items() if index < len(scores)},
                "advantage": advantages[index] if index < len(advantages) else None,
            }
            if extra:
                sample["extra"] = {column: values[index] for column, values in extra.items() if index < len(values)}
            # a tool's result may be any object: its text, as the model read it
            lines.append(json.dumps(sample, default=str) + "\n")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as file:
            file.writelines(lines)


def _step(line: str) -> float:
    """A line's step; a line a kill cut short is past every step."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")
