"""Trainer callbacks the runtime adds to every job: progress lines, token counting, preemption, the best-model
metric's check, fault injection."""

import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from posttrain.components.spec.chain import STAGE_ENV
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.process.distributed import collective_device

log = logging.getLogger("posttrain")

FAULT_ENV = "POSTTRAIN_FAULT"
FAULT_KINDS = ("raise", "hang", "exit", "kill")


class ProgressLog(TrainerCallback):
    """Rank 0's progress as plain log lines, where no terminal shows the trainer's progress bar.

    Under torchrun's ``--tee``, Slurm or Kubernetes the output is a file or a
    pipe: a progress bar there is a screenful of carriage returns. One line per
    trainer log instead: the step out of the planned steps, the logged values,
    the time so far and the time left at this attempt's pace.
    """

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.start, self.first_step = time.monotonic(), state.global_step

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[dict] = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        elapsed, done = time.monotonic() - self.start, state.global_step - self.first_step
        left = (
            f", {(state.max_steps - state.global_step) * elapsed / done:.0f} s left"
            if done and state.max_steps > 0
            else ""
        )
        values = ", ".join(
            f"{key} {value:.4g}"
            for key, value in logs.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "epoch"
        )
        log.info("step %d/%d: %s (%.0f s%s)", state.global_step, state.max_steps, values, elapsed, left)


class TokenCounter(TrainerCallback):
    """Remembers the tokens seen before this attempt (a resume restores them)."""

    at_start = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.at_start = state.num_input_tokens_seen


class Preemption(TrainerCallback):
    """On SIGTERM (a scheduler preempting the job), save a checkpoint at the end of the step and stop.

    Every rank learns of the signal through an all-reduce at each step end, so
    all of them take the same save (its collectives included) and stop together.
    """

    def __init__(self) -> None:
        self.requested = False
        self.stopped = False
        self._previous = signal.signal(signal.SIGTERM, self._request)

    def release(self) -> None:
        """SIGTERM as it was before training: what follows it (an evaluation) has no step end to stop at."""
        signal.signal(signal.SIGTERM, self._previous)

    def _request(self, signum: int, frame: Any) -> None:
        self.requested = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        flag = torch.tensor([float(self.requested)], device=collective_device())
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            self.stopped = True
            control.should_save = True
            control.should_training_stop = True
        return control


class BestMetricCheck(TrainerCallback):
    """Names a ``metric_for_best_model`` the evaluation does not return, in one line, at the first evaluation.

    What an evaluation returns depends on the trainer and the spec (GRPO's
    ``eval_rewards/<name>/mean``, DPO's ``eval_rewards/margins``, ...), so the
    first evaluation is where the name can be checked. transformers would raise
    a KeyError there too, as a traceback, after the evaluation; this check runs
    before it (``on_evaluate``), also at ``eval_on_start``, before any step.
    Every rank gets the same names (the losses and the trainers' metrics are
    gathered), so every rank stops here. It assumes one evaluation data set,
    as posttrain gives (with several, each returns only its own names).
    """

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Optional[dict] = None, **kwargs: Any) -> None:
        name = args.metric_for_best_model
        if name is None or metrics is None:
            return
        # as transformers looks it up
        key = name if name.startswith("eval_") else f"eval_{name}"
        if key not in metrics:
            returned = ", ".join(sorted(k for k in metrics if k.startswith("eval_")))
            raise SpecError(
                [
                    f"training.metric_for_best_model: {name} is not among the metrics the evaluation "
                    f"returns ({returned}); name one of them (eval_on_start: true checks it before "
                    "training)"
                ]
            )


class FaultInjection(TrainerCallback):
    """For testing only: ``POSTTRAIN_FAULT=<kind>:<rank>:<step>[@<stage>]`` makes one rank fail on purpose
    (in a chain, in the stage named after ``@`` only).

    ``raise`` raises, ``hang`` sleeps forever and ``exit`` leaves with status
    13, on rank ``rank`` when optimizer step ``step`` ends (``0``: before the
    first step). ``kill`` SIGKILLs the rank in the middle of the checkpoint
    save of step ``step``: after the model files, before the optimizer state;
    ``kill:0:final`` SIGKILLs rank 0 while the final model moves into
    ``output_dir``, after its first file. Each fault fires once per
    ``output_dir`` (a marker file records it), so a restarted or requeued job
    resumes instead of failing again.
    """

    def __init__(self, text: str, output_dir: Path) -> None:
        parts = text.split(":")
        final = len(parts) == 3 and parts[0] == "kill" and parts[2] == "final"
        if (
            len(parts) != 3
            or parts[0] not in FAULT_KINDS
            or not parts[1].isdigit()
            or not (parts[2].isdigit() or final)
        ):
            raise SpecError([f"{FAULT_ENV}={text!r}: expected <{'|'.join(FAULT_KINDS)}>:<rank>:<step>, e.g. raise:1:5"])
        # the final save has no step of its own: -1 matches no step's end
        self.kind, self.rank, self.step = parts[0], int(parts[1]), -1 if final else int(parts[2])
        self.marker = output_dir / f".posttrain_fault_{self.kind}_{self.rank}_{parts[2]}"

    @classmethod
    def from_env(cls, output_dir: Path) -> Optional["FaultInjection"]:
        text, _, stage = os.environ.get(FAULT_ENV, "").partition("@")
        if stage and stage != os.environ.get(STAGE_ENV):
            return None
        return cls(text, output_dir) if text else None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.step == 0:
            self._maybe_fire(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.step > 0:
            self._maybe_fire(state.global_step)

    def final_file_moved(self) -> None:
        """Called by the final save after each file it moves into ``output_dir``."""
        if self.step == -1 and _rank() == self.rank and not self.marker.exists():
            self._fire("the final save")
            os.kill(os.getpid(), signal.SIGKILL)

    def _maybe_fire(self, step: int) -> None:
        if step != self.step or _rank() != self.rank or self.marker.exists():
            return
        self._fire(f"step {self.step}")
        if self.kind == "kill":
            _kill_on_next_torch_save()

    def _fire(self, where: str) -> None:
        self.marker.parent.mkdir(parents=True, exist_ok=True)
        self.marker.write_text(f"{time.time()}\n")
        message = f"posttrain fault injection: {self.kind} on rank {self.rank} at {where}, t={time.time():.3f}"
        print(message, file=sys.stderr, flush=True)
        if self.kind == "raise":
            raise RuntimeError(message)
        if self.kind == "exit":
            os._exit(13)
        if self.kind == "hang":
            while True:
                time.sleep(60)


def _kill_on_next_torch_save() -> None:
    """The Trainer writes the model first, then the optimizer with torch.save: die there."""
    original = torch.save

    def save_then_die(*args: Any, **kwargs: Any) -> None:
        torch.save = original
        os.kill(os.getpid(), signal.SIGKILL)

    torch.save = save_then_die


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0
