"""The disk under ``output_dir``: room for what a run writes first, checked before it trains, and a write that fails
for lack of room (or a read-only file system) said in one line."""

import contextlib
import errno
import shutil
from pathlib import Path
from typing import Iterator, Optional

from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.sections import ModelSpec
from posttrain.entrypoints.process.distributed import says_any


def check_room(output_dir: Path, model_spec: ModelSpec, saves_checkpoints: bool) -> None:
    """Room in ``output_dir``'s file system for what the run writes first: a checkpoint (weights and the
    optimizer's two moments), or the final weights alone; estimated from a local model's weight files."""
    model = Path(model_spec.name_or_path).expanduser()
    if not model.is_dir():
        return
    weights = sum(path.stat().st_size for path in model.glob("*.safetensors")) or sum(
        path.stat().st_size for path in model.glob("*.bin")
    )
    saves = saves_checkpoints and model_spec.lora is None
    needed = weights * (3 if saves else 1)
    existing = next(path for path in (output_dir, *output_dir.absolute().parents) if path.exists())
    free = shutil.disk_usage(existing).free
    if free < needed:
        what = "one checkpoint (the weights and the optimizer's state)" if saves else "the trained weights"
        raise SpecError(
            [
                f"training.output_dir: {output_dir} has {free / 2**20:.1f} MiB free; {what} of {model} needs about "
                f"{needed / 2**20:.1f} MiB: make room, or use another output_dir"
            ]
        )


@contextlib.contextmanager
def disk_errors(output_dir: Path) -> Iterator[None]:
    """A write that fails for lack of room or a read-only file system ends this rank with one line.

    torch.save says a failed write as a RuntimeError of its stream writer
    ("basic_ios::clear: iostream error", then "unexpected pos"), not an
    OSError. A checkpoint left half-written is passed over by the next resume.
    """
    try:
        yield
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise
        raise SpecError([_write_failed(output_dir, error.strerror)], this_rank_only=True) from None
    except RuntimeError as error:
        if not says_any(error, ("iostream error", "file write failed", "PytorchStreamWriter failed")):
            raise
        raise SpecError([_write_failed(output_dir, None)], this_rank_only=True) from None


def _write_failed(output_dir: Path, reason: Optional[str]) -> str:
    try:
        free = shutil.disk_usage(output_dir).free
    except OSError:
        free = None
    # torch's writer does not say why: a full disk is the usual reason
    if reason is None:
        reason = "No space left on device" if free is not None and free < 1 << 20 else "the write failed"
    shown = "free space unknown" if free is None else f"{free / 2**20:.1f} MiB free"
    return (
        f"training.output_dir: writing into {output_dir} failed: {reason} ({shown}); make room (or a writable "
        "place) and run the same command again: it resumes from the last whole checkpoint"
    )
