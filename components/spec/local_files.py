"""What the client checks of the local files a spec names, where it can read them, before it submits.

The job loads the data with ``datasets`` (``entrypoints/inputs/data.py``) and the
models with transformers, which the client cannot afford to import (nor
torch). Where a data path or a model directory is there for the client
(always on local_cwd; on a cluster whose file system the client shares), it
says, in the job's own words: of data (up to ``CLIENT_BYTES`` read), a path
that is neither a data file nor a saved data set, text that is not UTF-8 or
is empty, a line that is not JSON, and columns that, after ``data.columns``
renames, are none of the sets the algorithm reads; of a model directory,
the files ``from_pretrained`` reads that it lacks. A path the client does not
see is left to the job, which makes the same checks (and more) with the same
functions; but a relative data path that names nothing here names nothing
where the job runs either (local_cwd and Slurm run in this directory, a
Kubernetes image holds the checkout), and is refused here.
"""

import codecs
import csv
import json
import re
from pathlib import Path
from typing import Any, Collection, Dict, List, Optional, Sequence, Tuple

from posttrain.components.spec.data_sources import DATA_SUFFIXES, is_glob, matched_paths, missing_path
from posttrain.components.spec.messages import SpecError

# How much of a file the client reads: every check of a small file in well under a second (a bigger file's
# columns are left to the job, since rows past this could hold a column the first ones lack)
CLIENT_BYTES = 8 << 20


def check_text(path: Path, where: str, limit: Optional[int] = None) -> None:
    """One streamed pass over a text file (or its first ``limit`` bytes): bytes that are not UTF-8, or no text.

    The JSON reader takes invalid bytes without a word and the trainer then
    fails on them mid-run; an empty file gives datasets' StopIteration, whose
    message is empty.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, lines, blank = 0, 1, True
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as error:
                # error.object is the decoder's pending bytes (never a newline) followed by this chunk
                at = offset - (len(error.object) - len(chunk)) + error.start
                line = lines + error.object[: error.start].count(b"\n")
                byte = error.object[error.start]
                where_in = f"byte 0x{byte:02x} at offset {at} (line {line})"
                raise SpecError([f"{where}.path: {path} is not UTF-8 text: {where_in}; save it as UTF-8"]) from None
            blank = blank and not chunk.strip()
            offset, lines = offset + len(chunk), lines + chunk.count(b"\n")
            if limit is not None and offset >= limit:
                break
    if offset == 0:
        raise SpecError([f"{where}: {path} is empty"])
    if blank:
        raise SpecError([f"{where}: {path} is empty (blank lines only)"])


def json_error(text: str) -> Optional[str]:
    """Where JSON or JSON Lines text stops parsing ("line 3 is not valid JSON (...)"), or None if it parses."""
    try:
        json.loads(text)
        # one valid document
        return None
    except json.JSONDecodeError as error:
        # the first document itself is broken (a JSON file, or line 1 of JSON Lines)
        if error.msg != "Extra data":
            return f"line {error.lineno} is not valid JSON ({error.msg}, column {error.colno})"
    # JSON Lines: one document a line
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                json.loads(line)
            except json.JSONDecodeError as error:
                return f"line {number} is not valid JSON ({error.msg}, column {error.colno})"
    return None


def column_problem(
    found: Sequence[str], renames: Dict[str, str], formats: Sequence[Tuple[str, ...]], where: str
) -> Optional[str]:
    """What is wrong with a data set's columns once ``data.columns`` renames them, or None."""
    # the renames of the section ``where`` is in: data.columns, evaluate.data.columns
    renamed_by = where[: max(where.find("data."), 0)] + "data.columns"
    missing = sorted(set(renames) - set(found))
    if missing:
        return f"{renamed_by}: {where} has no column {', '.join(missing)}; found {list(found)}"
    kept = set(found) - set(renames)
    taken = [f"{column} -> {renamed}" for column, renamed in renames.items() if renamed in kept]
    if taken:
        already = f"{where} has a column of that name already; rename that column too, or drop it from the data"
        return f"{renamed_by}: {', '.join(taken)}, but {already}"
    columns = [renames.get(column, column) for column in found]
    if not any(set(cols) <= set(columns) for cols in formats):
        expected = " or ".join("(" + ", ".join(cols) + ")" for cols in formats)
        return f"{where}: found columns {columns}; expected {expected} (map names with {renamed_by})"
    return None


def not_a_data_file(path: Path, where: str) -> SpecError:
    """A path whose suffix names no data file the job reads."""
    return SpecError([f"{where}.path: {path}: expected a .json, .jsonl, .parquet or .csv file"])


def not_a_saved_data_set(path: Path, where: str) -> Optional[SpecError]:
    """A directory that ``save_to_disk`` did not write, or None."""
    if any((path / name).is_file() for name in ("state.json", "dataset_dict.json")):
        return None
    return SpecError(
        [
            f"{where}.path: {path} is a directory, but not one datasets' save_to_disk wrote (no "
            "state.json or dataset_dict.json); name a .json, .jsonl, .parquet or .csv file"
        ]
    )


def _json_columns(path: Path, where: str) -> Optional[List[str]]:
    """The columns of a JSON or JSON Lines file the client read whole (every row's keys, in order), else None."""
    # its first CLIENT_BYTES only
    with path.open("rb") as stream:
        text = stream.read(CLIENT_BYTES).decode("utf-8", errors="replace")
    whole = path.stat().st_size <= CLIENT_BYTES
    if not whole:
        # whole lines only
        text = text[: text.rfind("\n") + 1]
    problem = json_error(text) if whole or not text.lstrip().startswith("[") else None
    if problem is not None:
        raise SpecError([f"{where}.path: {path} {problem}"])
    if not whole:
        return None
    try:
        document = json.loads(text)
        rows = document if isinstance(document, list) else [document]
    except json.JSONDecodeError:
        # JSON Lines
        rows = [json.loads(line) for line in text.split("\n") if line.strip()]
    return list(dict.fromkeys(key for row in rows if isinstance(row, dict) for key in row))


def _file_columns(path: Path, where: str) -> Optional[List[str]]:
    """A local data file's columns as the job's reader will find them, after the client's checks; None where the
    client cannot tell cheaply."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet
        except ImportError:
            return None
        try:
            return list(pyarrow.parquet.read_schema(path).names)
        except Exception as error:  # noqa: BLE001 -- anything the reader says of the user's file
            raise SpecError([f"{where}.path: cannot read {path}: {str(error).splitlines()[0]}"]) from None
    check_text(path, where, CLIENT_BYTES)
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as stream:
            return next(csv.reader(stream), [])
    return _json_columns(path, where)


def _saved_columns(path: Path, split: str, where: str) -> Optional[List[str]]:
    """A directory ``save_to_disk`` wrote: its split's columns, from the features its ``dataset_info.json`` lists."""
    problem = not_a_saved_data_set(path, where)
    if problem is not None:
        raise problem
    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        if split not in splits:
            raise SpecError([f"{where}.split: {path} has no split {split!r}; it has {', '.join(splits)}"])
        path = path / split
    info = path / "dataset_info.json"
    features = json.loads(info.read_text()).get("features") if info.is_file() else None
    return list(features) if isinstance(features, dict) else None


# what from_pretrained reads from a model directory: (what it is called in a message, the names that give it)
MODEL_FILES: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("config.json", ("config.json", "adapter_config.json")),
    ("weights (*.safetensors or *.bin)", ("*.safetensors", "*.bin")),
    (
        "tokenizer files (tokenizer.json, tokenizer.model, vocab.json, ...)",
        (
            "tokenizer.json",
            "tokenizer.model",
            "tekken.json",
            "vocab.json",
            "vocab.txt",
            "spiece.model",
            "tokenizer_config.json",
        ),
    ),
)
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def model_directory_problem(path: Path, name_or_path: str, where: str) -> Optional[str]:
    """What keeps an existing local path from being a model directory, or None: a file, or the files
    ``from_pretrained`` reads that it lacks (with the newest checkpoint, where a run stopped before its final save)."""
    if not path.is_dir():
        return f"{where}: {name_or_path} is a file; expected a model directory (from save_pretrained)"
    lacking = [what for what, names in MODEL_FILES if not any(next(path.glob(name), None) for name in names)]
    if not lacking:
        return None
    saved = [
        child for child in path.iterdir() if _CHECKPOINT.match(child.name) and (child / "trainer_state.json").is_file()
    ]
    newest = max(saved, key=lambda child: int(child.name.split("-")[1]), default=None)
    hint = f"; it holds {newest.name} (an unfinished run?): name that directory" if newest else ""
    return f"{where}: {name_or_path} is not a model directory: no " + ", no ".join(lacking) + hint


def local_model_problems(spec: Any, skip: Collection[str] = ()) -> List[str]:
    """The client's check of each model directory the spec names that it can see (a hub id, a built-in: the
    job's), but those in ``skip`` (a chain's stages' outputs: written by the job, maybe half so far)."""
    problems = []
    for where, name_or_path in spec.named_models():
        if not name_or_path.startswith("builtin:") and name_or_path not in skip:
            path = Path(name_or_path).expanduser()
            problem = model_directory_problem(path, name_or_path, where) if path.exists() else None
            problems += [problem] if problem else []
    return problems


def local_data_problems(spec: Any) -> List[str]:
    """The client's checks of each local data source it can read (``data.train``, ``data.eval``, or each source of
    a mixture: ``data.train.1``), and its ``evaluate:`` section's (``evaluate.data.eval``), one line each; a
    glob's files each."""
    readers = [("", spec.data, spec.data_formats)]
    evaluate = getattr(spec, "evaluate", None)
    if evaluate is not None:
        readers.append(("evaluate.", evaluate.data, evaluate.data_formats))
    # an evaluation of benchmarks alone has no held-out prompts
    readers = [(prefix, data, formats) for prefix, data, formats in readers if data is not None]
    problems = []
    for prefix, data, formats in readers:
        problems += _data_problems(data, formats, prefix)
    return problems


def _data_problems(data: Any, formats: Any, prefix: str) -> List[str]:
    problems = []
    for key, source in [*data.sources("train"), *data.sources("eval")]:
        where = prefix + key
        if source.path is None:
            # a hub data set: the job's
            continue
        renames = {**data.columns, **source.columns}
        found = [path for path in matched_paths(source.path) if path.exists()]
        # local_cwd and Slurm run here too
        if not found and not Path(source.path).is_absolute():
            problems.append(
                f"{missing_path(source.path, where)}; a file only the job's machines have: give its full path"
            )
        # an absolute path not here: maybe on the job's file system
        for path in found:
            try:
                if path.is_dir() and not is_glob(source.path):
                    columns = _saved_columns(path, source.split, where)
                elif path.suffix not in DATA_SUFFIXES:
                    raise not_a_data_file(path, where)
                else:
                    columns = _file_columns(path, where)
            except SpecError as error:
                problems += error.problems
                break
            except OSError as error:
                problems.append(f"{where}.path: cannot read {path}: {error.strerror or error}")
                break
            problem = None if columns is None else column_problem(columns, renames, formats, where)
            if problem is not None:
                problems.append(problem)
                break
    return problems
