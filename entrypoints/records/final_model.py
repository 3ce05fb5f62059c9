"""The run's final model: saved aside and moved into ``output_dir`` whole (:func:`publish_final`), the files that
make a model there, and whether a checkpoint is the run's last (its end is all a rerun has left to write)."""

import json
import os
import shutil
from pathlib import Path
from typing import Callable, List, Optional

from posttrain.entrypoints.process.distributed import env_rank
from posttrain.entrypoints.records.files import fsync_directory, fsynced_tree
from posttrain.entrypoints.records.fingerprints import is_weights, model_identity
from posttrain.entrypoints.records.summary import SUMMARY_FILE

# the final model, until it is whole and moved into output_dir
FINAL_STAGING = ".posttrain-final"


def model_files(output_dir: Path) -> List[str]:
    """The names of a model's files in ``output_dir`` itself, as ``from_pretrained`` and PEFT read them: its weights,
    their index, its config, a PEFT adapter's, its tokenizer's and processor's."""
    return model_identity(output_dir) if output_dir.is_dir() else []


def weight_files(output_dir: Path) -> List[str]:
    """The names of the weight files in ``output_dir`` itself (its checkpoints' are not looked at)."""
    return [name for name in model_files(output_dir) if is_weights(name) or name.endswith(".index.json")]


def already_finished(output_dir: Path, checkpoint: Path, max_steps: int) -> bool:
    """Whether the run ended at ``checkpoint`` and wrote its final outputs: a finished run is left as it is.

    A run of epochs (``max_steps`` unset) ends at the step count its trainer
    state recorded: resume already refused a checkpoint of another spec.
    """
    step = _at_last_step(checkpoint, max_steps)
    try:
        summary = json.loads((output_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return False
    return step is not None and summary.get("global_steps") == step


def at_last_step(checkpoint: Path, max_steps: int) -> bool:
    """Whether ``checkpoint`` holds the run's last step (``max_steps``, or for a run of epochs the step count its
    trainer state recorded): a run resumed from it has trained every step, and has only its end to write."""
    return _at_last_step(checkpoint, max_steps) is not None


def _at_last_step(checkpoint: Path, max_steps: int) -> Optional[int]:
    """``checkpoint``'s step where it is the run's last; None where it is not, or its state is unreadable."""
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        step = state["global_step"]
    except (OSError, ValueError, KeyError):
        return None
    last = max_steps if max_steps > 0 else state.get("max_steps", 0)
    return step if 0 < last <= step else None


def final_staging(output_dir: Path) -> Path:
    """Where rank 0 saves the final model before :func:`publish_final` moves it in; a killed run's leftover is
    removed first. The same path on every rank: a sharded model's save is collective."""
    staging = output_dir / FINAL_STAGING
    if env_rank() == 0:
        shutil.rmtree(staging, ignore_errors=True)
    return staging


def publish_final(staging: Path, output_dir: Path, moved: Optional[Callable[[], None]] = None) -> None:
    """Moves the final model from ``staging`` into ``output_dir``, durably, for ``run_summary.json`` to follow.

    ``output_dir`` holds checkpoints and logs, so it cannot be swapped whole:
    each file is renamed in. A reader (or a kill) mid-way sees old and new
    files mixed, but never a ``run_summary.json``: the old one goes first, and
    the run is finished only once the caller writes the new one. A model file
    there that the staged model has not (another's adapter, shard, index or
    tokenizer file) goes too: the published model loads alone. ``moved`` is
    called after each rename (fault injection).
    """
    (output_dir / SUMMARY_FILE).unlink(missing_ok=True)
    # a model file of another's that the new model does not replace would be loaded with it (an adapter, a shard)
    staged = {entry.name for entry in staging.iterdir()}
    for name in model_files(output_dir):
        if name not in staged:
            (output_dir / name).unlink()
    fsync_directory(output_dir)
    fsynced_tree(staging)
    for entry in sorted(staging.iterdir()):
        target = output_dir / entry.name
        if entry.is_dir() and target.is_dir():
            # a folder cannot be renamed over a non-empty one (our PPO's value_model/)
            shutil.rmtree(target)
        os.replace(entry, target)
        if moved is not None:
            moved()
    staging.rmdir()
    fsync_directory(output_dir)
