"""How the trainers and the ``vllm`` role take turns, timed, whichever way they take them (``run_ahead.py``: the role
generating ahead): what both log and summarise (:class:`Turns`), TRL's own lockstep (:class:`Lockstep`), and the
deadlines of a weight push and of a generation, past which the job ends in one line."""

import contextlib
import dataclasses
import functools
import os
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

from transformers import TrainerCallback

from posttrain.components.spec.generation import VLLM_HOST_VARIABLE, TrainingGeneration
from posttrain.entrypoints.generation.vllm_generation import sync_overdue
from posttrain.entrypoints.process.error_file import deadline


@dataclasses.dataclass
class Counts:
    """What ``metrics.jsonl`` logs per logging step and ``run_summary.json`` totals (rank 0's)."""

    staleness: List[int] = dataclasses.field(default_factory=list)
    trainer_wait_s: float = 0.0
    role_wait_s: float = 0.0
    weight_sync_s: float = 0.0
    weight_syncs: int = 0
    # the role's generation, and how much of it ran while the trainers trained, not waiting for it
    generate_s: float = 0.0
    overlap_s: float = 0.0

    def add(self, **amounts: float) -> None:
        for name, amount in amounts.items():
            setattr(self, name, getattr(self, name) + amount)


class Turns(TrainerCallback):
    """How the trainers and the role took turns: what both modes log and summarise."""

    def __init__(self, trainer: Any, schedule: TrainingGeneration) -> None:
        self.trainer = trainer
        self.schedule = schedule
        self.main = trainer.accelerator.is_main_process
        self.changed = threading.Condition()
        self.interval, self.total = Counts(), Counts()

    def count(self, staleness: Optional[int] = None, **amounts: float) -> None:
        with self.changed:
            for counts in (self.interval, self.total):
                counts.add(**amounts)
                if staleness is not None:
                    counts.staleness.append(staleness)

    def log(self, logs: Dict[str, float]) -> Dict[str, float]:
        """The metrics since the last log, added to a training log: per generation, and per push of the weights."""
        with self.changed:
            counts, self.interval = self.interval, Counts()
        if not counts.staleness:
            return logs
        generations = len(counts.staleness)
        logs = {
            **logs,
            "generation/staleness_mean": sum(counts.staleness) / generations,
            "generation/staleness_max": float(max(counts.staleness)),
            "generation/trainer_wait_s": counts.trainer_wait_s / generations,
        }
        if not self.schedule.runs_ahead:
            return logs
        return {
            **logs,
            "generation/role_wait_s": counts.role_wait_s / generations,
            "generation/overlap_s": counts.overlap_s / generations,
            "generation/weight_sync_s": counts.weight_sync_s / max(counts.weight_syncs, 1),
        }

    @contextlib.contextmanager
    def deadline(self, step: int) -> Iterator[None]:
        """The role takes the weights of ``step`` within ``weight_sync_timeout_s``, or the job ends in one line: rank
        0's timer ends the process itself (``error_file.deadline``), for a push can block where nothing raises (NCCL
        has no timeout, TRL's requests none)."""
        if not self.main:
            yield
            return
        base_url, timeout_s = self.trainer.vllm_generation.vllm_client.base_url, self.schedule.weight_sync_timeout_s
        line = f"posttrain: {sync_overdue(base_url, f'the weights of step {step}', timeout_s)}"
        with deadline(timeout_s, line):
            yield

    def summary(self) -> Dict[str, Any]:
        """``run_summary.json``'s account of the turns (rank 0's)."""
        total = self.total
        return {
            "max_lag": self.schedule.max_lag,
            "staleness_mean": sum(total.staleness) / len(total.staleness) if total.staleness else None,
            "staleness_max": max(total.staleness, default=None),
            "trainer_wait_s": round(total.trainer_wait_s, 3),
        }


class Lockstep(Turns):
    """TRL's own turns (``max_lag: 0``), timed: the trainers wait while the role takes the weights and generates."""

    def generate_single_turn(self, generate: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        generated = generate(*args, **kwargs)
        self.count(staleness=0, trainer_wait_s=time.monotonic() - started)
        return generated


def bound_generation(trainer: Any, schedule: TrainingGeneration) -> None:
    """Bounds each of ``trainer``'s vLLM generations (TRL's ``VLLMGeneration.generate``: the ``vllm`` role's or a
    server's, in lockstep; a colocated engine's) by ``generation.generate_timeout_s``: past it the job ends in one
    line naming the engine and the step, however the request or the engine hangs (a server that answers ``/health``
    and never the generation, an engine wedged). Where the server generates, rank 0 alone waits for it (the others,
    in a collective); a colocated engine, every rank's."""
    generation = trainer.vllm_generation
    if generation.mode == "server" and not trainer.accelerator.is_main_process:
        return
    seconds = schedule.generate_timeout(trainer.args.ddp_timeout)
    generate = generation.generate

    @functools.wraps(generate)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        step = trainer.state.global_step + 1
        if generation.mode == "server":
            line = overdue_generation(generation.vllm_client.base_url, step, seconds)
        else:
            rank = trainer.accelerator.process_index
            line = f"vllm engine (colocated, rank {rank}): the generation of step {step} did not end within "
            line += f"{seconds:g} s (generation.generate_timeout_s)"
        with deadline(seconds, f"posttrain: {line}"):
            return generate(*args, **kwargs)

    generation.generate = bounded


def overdue_generation(base_url: str, step: int, seconds: float) -> str:
    """The line of a server that did not answer the generation of ``step`` in time (the job's role, or one of the
    spec's)."""
    who = "vllm role: the server" if os.environ.get(VLLM_HOST_VARIABLE) else "vLLM: the server"
    return (
        f"{who} at {base_url} did not answer the generation of step {step} within {seconds:g} s "
        "(generation.generate_timeout_s); see its log"
    )
