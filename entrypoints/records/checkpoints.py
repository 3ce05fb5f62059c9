"""Resume: which checkpoint a job continues from, checked before it is trusted; checkpoints sealed and rotated.

``resume: auto`` takes the newest sound checkpoint in ``output_dir`` if
the spec that wrote it (``posttrain_spec.json``) matches this one in every
training-relevant key, and the data and the global batch it was trained on
are the ones this job has (``posttrain_inputs.json`` in the checkpoint,
also naming each model it was trained from: :func:`model_fingerprint`);
``never`` refuses a directory that holds checkpoints; a path resumes from
that checkpoint whatever changed. Before any of them (:func:`finished_at`),
whatever ``resume`` says: a finished model of another spec, or weights
posttrain did not write, are never overwritten, and this spec's finished run
is left as it is, unless ``overwrite_output_dir: true``. A damaged checkpoint
(a file cut short, unreadable or malformed, a shard its index names missing,
its state missing, or a check that failed) is named and passed over for the
one before; where all are damaged, ``auto`` stops; nothing is deleted.

A checkpoint of a posttrain run is whole only where its manifest
(``posttrain_manifest.json``, written last, after every rank's files are
in and fsynced: :func:`seal_checkpoint`) names every file it holds at its
size and each safetensors header by its hash: a shard, an RNG state or an
FSDP ``.distcp`` file missing or of another size is damage, whatever its
format. A checkpoint named by path (another tool's) needs no manifest.
"""

import dataclasses
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from transformers import TrainerCallback

from posttrain.components.spec.loading import spec_diff, training_relevant
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.sections import DataSpec
from posttrain.entrypoints.process.distributed import barrier, env_rank
from posttrain.entrypoints.records import fingerprints
from posttrain.entrypoints.records.files import (
    file_problem,
    fsync_directory,
    fsynced_tree,
    header_hash,
    judged,
    write_json_atomic,
)
from posttrain.entrypoints.records.final_model import model_files, weight_files
from posttrain.entrypoints.records.summary import SUMMARY_FILE

log = logging.getLogger("posttrain")

SPEC_FILE = "posttrain_spec.json"
INPUTS_FILE = "posttrain_inputs.json"
MANIFEST_FILE = "posttrain_manifest.json"


@dataclasses.dataclass(frozen=True)
class Resume:
    """What resume and the refusal to overwrite are decided from, read from the spec once: where the run writes,
    what ``resume`` and ``overwrite_output_dir`` say, the spec as its files record it, and the models and data
    it trains from."""

    output_dir: Path
    # auto, never, or a checkpoint's path
    mode: str
    overwrite: bool
    # the spec's JSON dump, as posttrain_spec.json and run_summary.json hold it
    spec_record: Dict[str, Any]
    # each model, by where the spec names it (Spec.named_models)
    models: Sequence[Tuple[str, str]]
    # posttrain loads every model at the policy's revision
    revision: Optional[str]
    data: DataSpec


_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# where a run that writes over another run's model (overwrite_output_dir) moves what that run left in output_dir
PREVIOUS_RUNS = "previous-runs"


def checkpoint_steps(output_dir: Path) -> List[Tuple[int, Path]]:
    """Every ``checkpoint-<step>`` folder, oldest first; other folders (a user's ``checkpoint-best``) are not ours."""
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), child) for child in output_dir.iterdir() if (m := _CHECKPOINT.match(child.name))]
    return sorted((step, path) for step, path in found if path.is_dir())


def complete_checkpoints(output_dir: Path) -> List[Path]:
    """Checkpoints whose save finished and whose files are whole, oldest first.

    The Trainer writes ``trainer_state.json`` last: a checkpoint without a
    readable one was interrupted mid-save and is never resumed from.
    """
    return [path for path, problem in checkpoint_verdicts(output_dir) if problem is None]


def checkpoint_verdicts(output_dir: Path) -> List[Tuple[Path, Optional[str]]]:
    """Every checkpoint, oldest first, with what makes it unusable (None: sound): its files as they are, then
    against its manifest, without which one of ``output_dir``'s checkpoints is a save cut short."""
    return [
        (path, judged(lambda: checkpoint_problem(path) or _manifest_problem(path)))
        for _, path in checkpoint_steps(output_dir)
    ]


def _manifest_problem(checkpoint: Path) -> Optional[str]:
    """What differs between ``checkpoint``'s files and its manifest: a file missing, of another size, a
    safetensors header that changed; files added since are not looked at."""
    manifest = checkpoint / MANIFEST_FILE
    if not manifest.is_file():
        return f"no {MANIFEST_FILE} (its save was interrupted)"
    for name, recorded in sorted(json.loads(manifest.read_text())["files"].items()):
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing (its manifest names it)"
        size = path.stat().st_size
        if size != recorded["bytes"]:
            return f"{name} is {size} bytes, its manifest says {recorded['bytes']}"
        if "header_sha256" in recorded and header_hash(path) != recorded["header_sha256"]:
            return f"{name}'s safetensors header changed since it was saved"
    return None


def seal_checkpoint(checkpoint: Path, inputs: Dict[str, Any]) -> None:
    """Makes ``checkpoint`` whole for resume: the inputs it was trained on, every file fsynced, then its manifest,
    last (rank 0, once every rank's files are in)."""
    write_json_atomic(checkpoint / INPUTS_FILE, inputs)
    files = {}
    for path in fsynced_tree(checkpoint):
        # an earlier seal's
        if path.name == MANIFEST_FILE:
            continue
        entry: Dict[str, Any] = {"bytes": path.stat().st_size}
        if path.suffix == ".safetensors":
            entry["header_sha256"] = header_hash(path)
        files[str(path.relative_to(checkpoint))] = entry
    write_json_atomic(checkpoint / MANIFEST_FILE, {"files": files})


def checkpoint_problem(checkpoint: Path) -> Optional[str]:
    """What makes ``checkpoint`` unusable, or None: its state unreadable, a file unreadable or cut short.

    Reads headers only (safetensors' header against the file's size, a zip's
    directory at its end): cheap for any model size.
    """
    return judged(lambda: _checkpoint_problem(checkpoint))


def _checkpoint_problem(checkpoint: Path) -> Optional[str]:
    if not _readable_state(checkpoint / "trainer_state.json"):
        return "no readable trainer_state.json (its save was interrupted)"
    for path in sorted(checkpoint.rglob("*")):
        if path.is_file():
            problem = file_problem(path)
            if problem is not None:
                return f"{path.relative_to(checkpoint)}: {problem}"
    return None


def _readable_state(path: Path) -> bool:
    try:
        return "global_step" in json.loads(path.read_text())
    except (OSError, ValueError):
        return False


def resolve_resume(resume: Resume, inputs: Dict[str, Any]) -> Optional[str]:
    """The checkpoint to resume from per ``resume``, or None to start fresh.

    ``inputs`` is what this job trains on (:func:`job_inputs`); ``resume:
    auto`` refuses a checkpoint trained on other data or another global batch.
    """
    output_dir = resume.output_dir
    verdicts = checkpoint_verdicts(output_dir)
    checkpoints = [path for path, problem in verdicts if problem is None]
    if resume.mode == "auto" and verdicts and not checkpoints:
        raise SpecError([_all_damaged(output_dir, verdicts)])
    _say_damaged(verdicts)
    if resume.mode == "never":
        if checkpoints:
            raise SpecError(
                [
                    f"resume: never, but {output_dir} already holds checkpoints ({checkpoints[-1].name}); "
                    "use another training.output_dir or remove them, so a later resume cannot mix two runs"
                ]
            )
        return None
    if resume.mode != "auto":
        path = Path(resume.mode)
        if not path.is_dir():
            raise SpecError([f"resume: {resume.mode!r} is neither auto, never nor an existing checkpoint directory"])
        problem = checkpoint_problem(path)
        if problem is not None:
            raise SpecError([f"resume: {path} is not a complete checkpoint: {problem}"])
        return str(path)
    if not checkpoints:
        return None
    saved_path = output_dir / SPEC_FILE
    if not saved_path.is_file():
        raise SpecError(
            [
                f"resume: auto found {checkpoints[-1]} but no {SPEC_FILE} saying what spec wrote it; set resume to that path"
            ]
        )
    saved = read_record(
        saved_path, "remove it and set resume to a checkpoint's path to continue, or use another training.output_dir"
    )
    differences = _spec_differences(saved, resume.spec_record)
    if differences:
        raise SpecError(
            [
                f"resume: auto found {checkpoints[-1]} written by a different spec ({_shown(differences)}); "
                "use another training.output_dir, or set resume to the checkpoint path to continue anyway"
            ]
        )
    _check_same_inputs(checkpoints[-1], inputs)
    return str(checkpoints[-1])


def _say_damaged(verdicts: List[Tuple[Path, Optional[str]]]) -> None:
    """One line per checkpoint newer than the newest sound one, which resume passes over (rank 0 says it)."""
    sound = [path for path, problem in verdicts if problem is None]
    newer = verdicts[verdicts.index((sound[-1], None)) + 1 :] if sound else verdicts
    if env_rank() != 0:
        return
    for path, problem in newer:
        instead = f"resuming from {sound[-1].name}" if sound else "no sound checkpoint before it"
        log.warning("resume: %s is damaged (%s); %s, leaving it as it is", path, problem, instead)


def _all_damaged(output_dir: Path, verdicts: List[Tuple[Path, Optional[str]]]) -> str:
    """One line for an ``output_dir`` whose checkpoints are all damaged: starting at step 0 is the user's call."""
    newest = [f"{path.name} ({problem})" for path, problem in reversed(verdicts)]
    more = f"; and {len(newest) - 3} more" if len(newest) > 3 else ""
    return (
        f"resume: auto found no whole checkpoint in {output_dir}, only damaged ones: {'; '.join(newest[:3])}{more}; "
        "remove them to start over from step 0, or use another training.output_dir (or resume: never there)"
    )


def finished_at(resume: Resume, inputs: Dict[str, Any]) -> Optional[int]:
    """The step this spec's finished run in ``output_dir`` ended at (nothing to train), or None: train.

    Whatever ``resume`` says, a finished model of another spec (or trained on
    other inputs), or weights posttrain did not write, are refused rather than
    overwritten; ``overwrite_output_dir: true`` lets the run write over any of
    them, this spec's finished model included. A run is finished once its
    ``run_summary.json`` is written, last, with the spec it ran and its inputs (the models it was trained from
    among them: a model retrained since makes the run stale, not finished).
    """
    output_dir = resume.output_dir
    if resume.overwrite:
        return None
    # it lifts these refusals, not resume's: a run started over among another run's checkpoints could resume one later
    start_over = "remove its checkpoints and set" if checkpoint_steps(output_dir) else "set"
    summary = _read_json(output_dir / SUMMARY_FILE)
    if isinstance(summary, dict) and isinstance(summary.get("spec"), dict):
        differences = _spec_differences(summary["spec"], resume.spec_record)
        # what the run was trained from: recorded in its summary, or (an older posttrain's) in its last checkpoint
        checkpoints = complete_checkpoints(output_dir)
        recorded = summary.get("inputs") or (_read_json(checkpoints[-1] / INPUTS_FILE) if checkpoints else None)
        changes = fingerprints.input_changes(recorded, inputs) if not differences else []
        if differences or changes:
            what = (
                f"a finished model written by a different spec ({_shown(differences)})"
                if differences
                else f"this spec's finished model, but {'; '.join(changes)}"
            )
            raise SpecError(
                [
                    f"training.output_dir: {output_dir} holds {what}; use another training.output_dir, "
                    f"or {start_over} overwrite_output_dir: true to train over it"
                ]
            )
        return summary.get("global_steps") or 0
    weights = weight_files(output_dir)
    if weights and not (output_dir / SPEC_FILE).is_file():
        raise SpecError(
            [
                f"training.output_dir: {output_dir} holds weights posttrain did not write ({', '.join(weights[:3])}; "
                f"no {SPEC_FILE}); use another training.output_dir, or {start_over} overwrite_output_dir: true to "
                "write over them"
            ]
        )
    return None


def holds_a_run(output_dir: Path) -> bool:
    """Whether ``output_dir`` itself holds a model or a finished run's summary: what ``overwrite_output_dir`` lets a
    run write over."""
    return (output_dir / SUMMARY_FILE).exists() or bool(model_files(output_dir))


def set_aside_previous_run(output_dir: Path) -> Optional[Path]:
    """Moves what a previous run left in ``output_dir`` itself (its model, its records, anything else beside them)
    into ``previous-runs/<time>/`` (returned; None where it left nothing), its ``run_summary.json`` first: nothing of
    it is loaded with the new model, nor lost. Its checkpoints, the logs, and posttrain's hidden files stay."""
    left = [
        entry
        for entry in output_dir.iterdir()
        if not (entry.name.startswith(".") or entry.name in ("logs", PREVIOUS_RUNS) or _CHECKPOINT.match(entry.name))
    ]
    if not left:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    target = output_dir / PREVIOUS_RUNS / stamp
    suffix = 1
    while target.exists():
        suffix += 1
        target = output_dir / PREVIOUS_RUNS / f"{stamp}-{suffix}"
    target.mkdir(parents=True)
    for entry in sorted(left, key=lambda entry: entry.name != SUMMARY_FILE):
        os.replace(entry, target / entry.name)
    fsync_directory(output_dir)
    return target


def _spec_differences(saved: Dict[str, Any], record: Dict[str, Any]) -> List[Tuple[str, Any, Any]]:
    """The training-relevant keys in which two spec dumps differ."""
    return [d for d in spec_diff(saved, record) if training_relevant(d[0])]


def _shown(differences: List[Tuple[str, Any, Any]]) -> str:
    """The first differences, as one line holds them (another algorithm's spec differs in dozens of keys)."""
    shown = "; ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in differences[:3])
    return shown + (f"; and {len(differences) - 3} more" if len(differences) > 3 else "")


def read_record(path: Path, remedy: str, keys: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """A JSON object posttrain wrote and relies on, or one line naming the file and ``remedy`` where it is cut
    short or garbled (a disk filled, a hand edit): never a traceback."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        # a UnicodeDecodeError is a ValueError too
        data = None
    if not isinstance(data, dict) or any(key not in data for key in keys):
        raise SpecError([f"{path} is cut short or not what posttrain wrote; {remedy}"])
    return data


def _read_json(path: Path) -> Any:
    """A JSON file's contents, or None where it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def job_inputs(resume: Resume, global_batch: Dict[str, int], datasets: Any) -> Dict[str, Any]:
    """What a checkpoint depends on besides its spec: each data split's and each model's fingerprint (by content,
    ``fingerprints.py``), and the global batch (``processes``, ``per_device_train_batch_size``,
    ``gradient_accumulation_steps``); with the digests read (``seen``), so that a later run reads only files changed
    since."""
    for recorded in _recorded_inputs(resume.output_dir):
        fingerprints.remember(recorded)
    return {
        "data": {
            where: fingerprints.split_fingerprint(resume.data, where.split(".")[1], dataset)
            for where, dataset in datasets
        },
        "models": fingerprints.model_fingerprints(resume.models, resume.revision),
        "global_batch": global_batch,
        "seen": fingerprints.seen(),
    }


def _recorded_inputs(output_dir: Path) -> List[Tuple[Path, Any]]:
    """What ``output_dir``'s finished run (its ``run_summary.json``) and each of its checkpoints record they were
    trained on, by the file that records it."""
    summary = _read_json(output_dir / SUMMARY_FILE)
    found = [(output_dir / SUMMARY_FILE, summary.get("inputs") if isinstance(summary, dict) else None)]
    return found + [(path, _read_json(path / INPUTS_FILE)) for _, path in checkpoint_steps(output_dir)]


def _check_same_inputs(checkpoint: Path, inputs: Dict[str, Any]) -> None:
    """``resume: auto`` continues only what the checkpoint was trained on (a checkpoint without a record passes)."""
    changes = fingerprints.input_changes(_read_json(checkpoint / INPUTS_FILE), inputs)
    if changes:
        raise SpecError(
            [
                f"resume: auto found {checkpoint}, but {'; '.join(changes)}; run as it was (the same data and -j), "
                "use another training.output_dir, or set resume to the checkpoint path to continue anyway"
            ]
        )


def stale_runs(
    models: Sequence[Tuple[str, str]], revision: Optional[str], data: DataSpec, output_dir: Path
) -> Tuple[List[str], List[Path]]:
    """What in ``output_dir`` was trained from other models than ``models`` (by where a spec names each) are now,
    or on other local data than ``data`` holds now: what changed, and the files that record it (its finished run's
    ``run_summary.json``, its checkpoints). Data from the hub is not loaded here, and not compared."""
    recorded = _recorded_inputs(output_dir)
    for _, inputs in recorded:
        fingerprints.remember(inputs)
    models_now = fingerprints.model_fingerprints(models, revision)
    splits = [("data.train", "train"), ("data.eval", "eval")]
    data_now = fingerprints.local_data(
        {where: fingerprints.split_fingerprint(data, split, None) for where, split in splits if data.sources(split)}
    )
    changes: List[str] = []
    stale: List[Path] = []
    for path, inputs in recorded:
        changed = fingerprints.model_changes(inputs, models_now) + fingerprints.data_changes(inputs, data_now)
        stale += [path] if changed else []
        changes += [change for change in changed if change not in changes]
    return changes, stale


class SealCheckpoints(TrainerCallback):
    """Seals each checkpoint as it is saved (:func:`seal_checkpoint`), once every rank has written its part (the
    Trainer waits for no rank after its RNG states and shards), then rotates them (:func:`rotate_checkpoints`)."""

    def __init__(self, inputs: Dict[str, Any], save_total_limit: Optional[int]) -> None:
        self.inputs = inputs
        self.save_total_limit = save_total_limit

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        barrier()
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and checkpoint.is_dir():
            seal_checkpoint(checkpoint, self.inputs)
            rotate_checkpoints(Path(args.output_dir), self.save_total_limit, state.best_model_checkpoint)


# a checkpoint being removed: no longer a checkpoint-<step>, so a kill mid-way leaves nothing resume could take
_REMOVING = ".posttrain-removing-"


def rotate_checkpoints(output_dir: Path, limit: Optional[int], best: Optional[str]) -> None:
    """Keeps the newest ``limit`` (``save_total_limit``) whole checkpoints, the best one (``best_model_checkpoint``)
    among them as the Trainer keeps it, and removes the whole ones beyond them and anything older than the oldest
    kept; a damaged checkpoint newer than that stays (resume passes it over).

    The Trainer's own rotation runs before the new checkpoint is sealed, and would leave only a half-sealed one to a
    kill in between (``training_arguments`` turns it off). A removal renames the checkpoint first: a kill mid-way
    leaves a hidden folder the next rotation removes, never a ``checkpoint-<step>`` cut short.
    """
    for leftover in output_dir.glob(f"{_REMOVING}*"):
        shutil.rmtree(leftover, ignore_errors=True)
    whole = complete_checkpoints(output_dir)
    if not limit or len(whole) <= limit:
        return
    protected = {whole[-1]} | ({Path(best)} & set(whole) if best else set())
    kept = set(protected)
    for path in reversed(whole):
        if len(kept) >= max(limit, len(protected)):
            break
        kept.add(path)
    oldest_kept = min(step for step, path in checkpoint_steps(output_dir) if path in kept)
    for step, path in checkpoint_steps(output_dir):
        if path not in kept and (path in whole or step < oldest_kept):
            removing = path.with_name(_REMOVING + path.name)
            os.replace(path, removing)
            shutil.rmtree(removing, ignore_errors=True)
