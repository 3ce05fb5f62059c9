"""Resume: which checkpoint a job continues from, and files written so a kill never leaves half of one.

``resume: auto`` takes the newest complete checkpoint in ``output_dir`` if
the spec that wrote it (``posttrain_spec.json``) matches this one in every
training-relevant key; ``never`` refuses a directory that holds checkpoints;
a path resumes from that checkpoint.
"""

import json
import os
import re
from pathlib import Path
from typing import Any, List, Optional

from posttrain.components.messages import SpecError
from posttrain.components.schema import Spec
from posttrain.components.spec import NOT_TRAINING_RELEVANT, spec_diff
from posttrain.entrypoints.summary import SUMMARY_FILE

SPEC_FILE = "posttrain_spec.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def complete_checkpoints(output_dir: Path) -> List[Path]:
    """Checkpoints whose save finished, oldest first.

    The Trainer writes ``trainer_state.json`` last: a checkpoint without a
    readable one was interrupted mid-save and is never resumed from.
    """
    if not output_dir.is_dir():
        return []
    found = []
    for child in output_dir.iterdir():
        match = _CHECKPOINT.match(child.name)
        if match and child.is_dir() and _readable_state(child / "trainer_state.json"):
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def _readable_state(path: Path) -> bool:
    try:
        return "global_step" in json.loads(path.read_text())
    except (OSError, ValueError):
        return False


def resolve_resume(spec: Spec, output_dir: Path) -> Optional[str]:
    """The checkpoint to resume from per ``resume``, or None to start fresh."""
    checkpoints = complete_checkpoints(output_dir)
    if spec.resume == "never":
        if checkpoints:
            raise SpecError(
                [
                    f"resume: never, but {output_dir} already holds checkpoints ({checkpoints[-1].name}); "
                    "use another training.output_dir or remove them, so a later resume cannot mix two runs"
                ]
            )
        return None
    if spec.resume != "auto":
        path = Path(spec.resume)
        if not _readable_state(path / "trainer_state.json"):
            if not path.is_dir():
                raise SpecError([f"resume: {spec.resume!r} is neither auto, never nor an existing checkpoint directory"])
            raise SpecError([f"resume: {path} is not a complete checkpoint (no readable trainer_state.json)"])
        return str(path)
    if not checkpoints:
        return None
    saved_path = output_dir / SPEC_FILE
    if not saved_path.is_file():
        raise SpecError(
            [f"resume: auto found {checkpoints[-1]} but no {SPEC_FILE} saying what spec wrote it; set resume to that path"]
        )
    saved = json.loads(saved_path.read_text())
    current = spec.model_dump(mode="json")
    differences = [d for d in spec_diff(saved, current) if d[0] not in NOT_TRAINING_RELEVANT]
    if differences:
        shown = "; ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in differences)
        raise SpecError(
            [
                f"resume: auto found {checkpoints[-1]} written by a different spec ({shown}); "
                "use another training.output_dir, or set resume to the checkpoint path to continue anyway"
            ]
        )
    return str(checkpoints[-1])


def already_finished(output_dir: Path, checkpoint: Path, max_steps: int) -> bool:
    """Whether the run ended at ``checkpoint`` and wrote its final outputs.

    Resuming from a checkpoint at ``max_steps`` would make the Trainer take
    one step too many, so a finished run is left as it is. A run of epochs
    (``max_steps`` unset) ends at the step count its trainer state recorded:
    resume already refused a checkpoint of another spec.
    """
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        step = state["global_step"]
        summary = json.loads((output_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError, KeyError):
        return False
    last = max_steps if max_steps > 0 else state.get("max_steps", 0)
    return 0 < last <= step and summary.get("global_steps") == step


def write_json_atomic(path: Path, data: Any) -> None:
    """Writes ``data`` as JSON through a temporary file: readers see the old file or the new one, never half."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(temporary, path)
