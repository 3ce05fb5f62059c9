"""Files written whole and judged whole: atomic JSON, fsync, and whether a weights, torch or JSON file is cut short.

Judging reads headers only (safetensors' header against the file's size, a
zip's directory at its end): cheap for any model size. Checkpoints and local
models are judged by these.
"""

import contextlib
import hashlib
import json
import os
import secrets
import struct
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

# torch.save's files (zip archives): what a checkpoint of any trainer here holds besides safetensors and JSON
TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def judged(judge: Callable[[], Optional[str]]) -> Optional[str]:
    """A judge's verdict; one that fails (a file it did not foresee) calls the checkpoint damaged, never the run."""
    try:
        return judge()
    except Exception as error:
        # whatever stops the judging stops a resume from it too
        # one line
        return f"could not be checked ({type(error).__name__}: {' '.join(str(error).split())})"


def fsynced_tree(root: Path) -> List[Path]:
    """Every file under ``root``, each fsynced, and every folder's names (``root``'s too): durable before a
    mark that says they are whole."""
    files = []
    # each file and folder before the folder holding it
    for path in sorted(root.rglob("*"), reverse=True):
        if path.is_dir():
            fsync_directory(path)
        else:
            with path.open("rb") as stream:
                os.fsync(stream.fileno())
            files.append(path)
    fsync_directory(root)
    return sorted(files)


def header_hash(path: Path) -> str:
    """The SHA-256 of a safetensors file's header: its tensors' names, dtypes, shapes and places."""
    with path.open("rb") as stream:
        (header_size,) = struct.unpack("<Q", stream.read(8))
        return hashlib.sha256(stream.read(header_size)).hexdigest()


def file_problem(path: Path) -> Optional[str]:
    """Why a weights, torch or JSON file is not whole, or None (other files are not looked into); an index
    (``*.index.json``) is whole where every shard its ``weight_map`` names is there and whole."""
    return judged(lambda: _file_problem(path))


def _file_problem(path: Path) -> Optional[str]:
    try:
        size = path.stat().st_size
        with path.open("rb") as stream:
            if path.suffix == ".safetensors":
                return _safetensors_problem(stream, size)
            if path.suffix in TORCH_SUFFIXES and size > 0:
                try:
                    with zipfile.ZipFile(stream) as archive:
                        ends = max((i.header_offset + i.compress_size for i in archive.infolist()), default=0)
                except zipfile.BadZipFile:
                    return f"not a whole torch file ({size} bytes)"
                return None if ends <= size else f"cut short at {size} bytes"
            if path.suffix == ".json":
                try:
                    data = json.loads(stream.read())
                except ValueError:
                    # a UnicodeDecodeError too
                    return "not valid JSON"
                if path.name.endswith(".index.json"):
                    return _index_problem(path, data)
    except OSError as error:
        return f"unreadable ({error.strerror})"
    return None


def _safetensors_problem(stream: Any, size: int) -> Optional[str]:
    head = stream.read(8)
    if len(head) < 8:
        return f"cut short at {size} bytes"
    (header_size,) = struct.unpack("<Q", head)
    if 8 + header_size > size:
        return f"cut short at {size} bytes (its header alone is {header_size} bytes)"
    try:
        header = json.loads(stream.read(header_size))
    except ValueError:
        return "its header is not valid JSON"
    if not isinstance(header, dict):
        return f"its header is a JSON {type(header).__name__}, not an object of tensors"
    ends = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(entry, dict) and "dtype" in entry and _ints(entry.get("shape")) and _ints(offsets, 2)):
            return f"its header's tensor {name!r} lacks a dtype, a shape or two integer data_offsets"
        if offsets[0] > offsets[1]:
            return f"its header's tensor {name!r} has data_offsets {offsets}, which do not run forward"
        ends = max(ends, offsets[1])
    expected = 8 + header_size + ends
    return None if expected <= size else f"cut short at {size} of {expected} bytes"


def _ints(value: Any, length: Optional[int] = None) -> bool:
    """Whether ``value`` is a list of non-negative integers (of ``length``); JSON's true is no integer here."""
    return (
        isinstance(value, list)
        and (length is None or len(value) == length)
        and all(isinstance(item, int) and not isinstance(item, bool) and item >= 0 for item in value)
    )


def _index_problem(index: Path, data: Any) -> Optional[str]:
    """What is wrong with the shards a sharded model's index names (beside it): missing, or not whole."""
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        return "no weight_map naming its shards"
    shards = sorted({str(name) for name in weight_map.values()})
    missing = [name for name in shards if not (index.parent / name).is_file()]
    if missing:
        return f"names {len(missing)} shard(s) that are missing ({', '.join(missing[:3])})"
    for name in shards:
        # an index naming an index would be judged without end
        problem = None if name.endswith(".json") else file_problem(index.parent / name)
        if problem is not None:
            return f"its shard {name}: {problem}"
    return None


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for the caller to write, renamed over ``path`` once the block ends (removed
    if it raises): readers see the old file or the new one, never half. Its name is this process's alone, so two
    processes writing one file never write into one temporary file."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_json_atomic(path: Path, data: Any) -> None:
    """Writes ``data`` as JSON through a temporary file (:func:`replacing`).

    Both the file and its directory are fsynced: after a power loss the name may otherwise point at no data.
    """
    with replacing(path) as temporary, temporary.open("w") as stream:
        stream.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        stream.flush()
        os.fsync(stream.fileno())
    fsync_directory(path.parent)


def fsync_directory(path: Path) -> None:
    """Makes the names in ``path`` durable (a new file, a rename): fsyncing a file does not."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
