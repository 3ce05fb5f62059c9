"""What a run is trained from, known by its content: each model's and each data source's fingerprint, and what
differs between a record and now.

A local model directory is known by the SHA-256 of each of its weight files and of the small files that say what
it is (config, adapter config, tokenizer); a local data file, a glob's files or a saved data set's files by the
SHA-256 of each; a hub model by its id and revision, a hub data set by its name and the ``datasets`` fingerprint of
what loaded. A change in any byte that can change a weight changes the fingerprint, whoever wrote the files: a
model trained again, or edited in place.

Hashing reads every byte once per process (1.6 GB/s on the CPU machine: BENCHMARKS.md). A file read before is
not read again where its size, modification and change times and inode are those recorded (:func:`remember`,
:func:`seen`): a change of content changes its change time, which no one sets back.
"""

import glob
import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from posttrain.components.spec.sections import DataSpec
from posttrain.entrypoints.records.files import TORCH_SUFFIXES

# what the name of a file with a model's weights ends with, beside a PEFT adapter's
_WEIGHT_SUFFIXES = (".safetensors", *TORCH_SUFFIXES)
# the Trainer's arguments, which it torch.saves beside the model: no weight
_NOT_WEIGHTS = ("training_args.bin",)
# a model directory's small files that say what it is: its config, a PEFT adapter's, its tokenizer's and processor's
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "adapter_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "tekken.json",
    "spiece.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
)
# keys of a record an older posttrain wrote, which named a model or a large file by less than its content
_OLDER_KEYS = ("run_id", "sha256_sampled", "sha256_head_tail")

# this process's digests: (path, size, mtime_ns, ctime_ns, inode) -> SHA-256
_DIGESTS: Dict[Tuple[str, int, int, int, int], str] = {}


def file_digest(path: Path) -> str:
    """The SHA-256 of ``path``'s bytes; read once while its size, times and inode stay as they were."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with path.open("rb") as stream:
            for chunk in iter(lambda: stream.read(4 << 20), b""):
                digest.update(chunk)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


def seen() -> Dict[str, List[Any]]:
    """What this process digested, as a record keeps it for :func:`remember`: each file's size, times, inode and
    digest, by its resolved path."""
    return {key[0]: [*key[1:], digest] for key, digest in _DIGESTS.items()}


def remember(recorded: Any) -> None:
    """Takes the digests a record kept (its ``seen``) as this process's own: files unchanged since are not read."""
    if not isinstance(recorded, Mapping) or not isinstance(recorded.get("seen"), Mapping):
        return
    for path, entry in recorded["seen"].items():
        if isinstance(entry, list) and len(entry) == 5:
            _DIGESTS.setdefault((path, *entry[:4]), entry[4])


def model_fingerprints(models: Sequence[Tuple[str, str]], revision: Optional[str]) -> Dict[str, Dict[str, Any]]:
    """Each model the spec reads, by where it names it (``model.name_or_path``, ``reference_model``,
    ``rewards.0.model``, ...): what the run is trained from."""
    return {where: model_fingerprint(name, revision) for where, name in models}


def model_fingerprint(name_or_path: str, revision: Optional[str] = None) -> Dict[str, Any]:
    """A hub id or built-in by its name and revision; a local directory by the digest of each weight file and of
    each file that says what the model is."""
    path = Path(name_or_path).expanduser()
    if name_or_path.startswith("builtin:") or not path.is_dir():
        return {"source": name_or_path, "revision": revision}
    return {"source": name_or_path, "files": {name: file_digest(path / name) for name in model_identity(path)}}


def model_identity(path: Path) -> List[str]:
    """The files of the model in ``path`` that a fingerprint reads: its weights, their index, its config files."""
    return sorted(
        file.name
        for file in path.iterdir()
        if file.is_file()
        and file.name not in _NOT_WEIGHTS
        and (file.name in MODEL_FILES or is_weights(file.name) or file.name.endswith(".index.json"))
    )


def is_weights(name: str) -> bool:
    """Whether a file of this name holds a model's weights (a whole file, a shard, a PEFT adapter)."""
    return name not in _NOT_WEIGHTS and (name.endswith(_WEIGHT_SUFFIXES) or name.startswith("adapter_model."))


def split_fingerprint(data: DataSpec, split: str, dataset: Any) -> Dict[str, Any]:
    """``data.train``'s or ``data.eval``'s fingerprint: its source's, or a mixture's sources' with how they mix.
    ``dataset``, the loaded split, names a hub data set (None: a local one, or not loaded here)."""
    sources = data.sources(split)
    if len(sources) == 1:
        source = sources[0][1]
        capped = {"max_rows": source.max_rows} if source.max_rows is not None else {}
        return {**data_fingerprint(source, dataset), **capped}
    parts = [
        {**data_fingerprint(source, None), "max_rows": source.max_rows, "weight": source.weight}
        for _, source in sources
    ]
    return {"source": ", ".join(part["source"] for part in parts), "mix": data.mix, "parts": parts}


def data_fingerprint(source: Any, dataset: Any) -> Dict[str, Any]:
    """A local file by its digest; a glob's files, or a saved data set's (a directory), by each one's; a hub data set
    by the ``datasets`` fingerprint of what loaded (None where nothing loaded here); generated rows by their source
    and reasoning-gym's version; a verifiers taskset's by its rows."""
    if source.reasoning_gym is not None:
        # the rows are what the source says and the installed generators make of it
        try:
            version: Optional[str] = importlib.metadata.version("reasoning-gym")
        except importlib.metadata.PackageNotFoundError:
            version = None
        return {"source": "reasoning_gym", "generation": source.reasoning_gym.model_dump(), "reasoning_gym": version}
    if source.verifiers is not None:
        # the rows are the tasks the taskset's installed code makes of its args
        rows = json.dumps(dataset.to_list(), sort_keys=True).encode() if dataset is not None else None
        return {
            "source": "verifiers",
            "taskset": source.verifiers.model_dump(),
            "rows_sha256": hashlib.sha256(rows).hexdigest() if rows is not None else None,
            "verifiers": importlib.metadata.version("verifiers"),
        }
    files = local_files(source.path) if source.path is not None else []
    if not files:
        return {"source": source.path or source.name, "fingerprint": getattr(dataset, "_fingerprint", None)}
    path = Path(source.path).expanduser()
    if files == [path]:
        return {"source": str(path), "bytes": path.stat().st_size, "sha256": file_digest(path)}
    named = {str(file.relative_to(path) if path.is_dir() else file): file_digest(file) for file in files}
    return {"source": source.path, "files": named}


def local_files(path: str) -> List[Path]:
    """The files a data source's ``path`` names here: itself, a glob's matches, or a directory's files; none where
    it names nothing local (a hub data set)."""
    given = Path(path).expanduser()
    if given.is_file():
        return [given]
    if given.is_dir():
        return sorted(file for file in given.rglob("*") if file.is_file())
    return sorted(Path(match) for match in glob.glob(str(given), recursive=True) if Path(match).is_file())


def input_changes(recorded: Any, inputs: Mapping[str, Any]) -> List[str]:
    """How this job's inputs differ from what a checkpoint or a finished run records it was trained on (none
    where there is no record)."""
    if not isinstance(recorded, Mapping):
        return []
    changes = model_changes(recorded, inputs.get("models", {}))
    changes += data_changes(recorded, inputs["data"])
    before, now = recorded["global_batch"], inputs["global_batch"]
    if before != now:
        changes.append(f"the global batch was {_batch_text(before)} and is now {_batch_text(now)}")
    return changes


def model_changes(recorded: Any, models: Mapping[str, Mapping[str, Any]]) -> List[str]:
    """The models that are not the ones a record says the run was trained from (none where it names none: a
    record of an older posttrain)."""
    before = recorded.get("models") if isinstance(recorded, Mapping) else None
    if not isinstance(before, Mapping):
        return []
    return [
        f"{where} ({now['source']}) is not the model it was trained from"
        for where, now in models.items()
        if where in before and _differs(before[where], now)
    ]


def data_changes(recorded: Any, data: Mapping[str, Mapping[str, Any]]) -> List[str]:
    """The data splits that are not what a record says the run was trained on."""
    before = recorded.get("data") if isinstance(recorded, Mapping) else None
    if not isinstance(before, Mapping):
        return []
    return [
        f"{where} ({now['source']}) changed since it was saved"
        for where, now in data.items()
        if _differs(before.get(where), now)
    ]


def local_data(data: Mapping[str, Mapping[str, Any]]) -> Dict[str, Mapping[str, Any]]:
    """The splits whose every source is local (known here by content, with no data set loaded)."""
    return {where: split for where, split in data.items() if "fingerprint" not in _flat_keys(split)}


def _differs(before: Any, now: Any) -> bool:
    """Whether two fingerprints name different content; one of an older posttrain's records (a model by its run's
    id, a large file by its head and tail) cannot tell, and counts as the same."""
    return before != now and not set(_OLDER_KEYS) & _flat_keys(before)


def _flat_keys(value: Any) -> set:
    """Every key of a fingerprint, its parts' and files' too."""
    if isinstance(value, Mapping):
        return set(value) | set().union(*(_flat_keys(item) for item in value.values()))
    if isinstance(value, list):
        return set().union(*(_flat_keys(item) for item in value))
    return set()


def _batch_text(batch: Mapping[str, int]) -> str:
    factors = [batch["processes"], batch["per_device_train_batch_size"], batch["gradient_accumulation_steps"]]
    return f"{factors[0] * factors[1] * factors[2]} ({' x '.join(map(str, factors))}: processes x per device x accumulation)"
