"""What a spec's ``data`` section may say: each source named once, the way a local file, a hub data set or
reasoning-gym's generated rows are named; a mixture of several that holds together; held-out rows generated from a
seed of their own. The sections themselves are ``sections.DataSource`` and ``sections.DataSpec``; the job reads
them in ``entrypoints/inputs/data.py``."""

import glob
from pathlib import Path
from typing import Any, Dict, List, Tuple

from posttrain.components.spec.messages import cut

# What a local data file's name ends with: one split; a directory save_to_disk wrote may hold several
DATA_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv")
GLOB_CHARACTERS = "*?["


def is_glob(path: str) -> bool:
    """Whether a source's path is a glob of files (``data/*.jsonl``) rather than one file or directory."""
    return any(character in path for character in GLOB_CHARACTERS)


def matched_paths(path: str) -> List[Path]:
    """The files a glob matches, in order; a path that is no glob, as it is (whether or not it exists)."""
    return [Path(match) for match in sorted(glob.glob(path))] if is_glob(path) else [Path(path)]


def missing_path(pattern: str, where: str) -> str:
    """A local source's path that names no file, as the client and the job say it."""
    what = "no file matches" if is_glob(pattern) else "no such file:"
    # no ~: never expanded
    relative = "" if Path(pattern).is_absolute() else f" (relative paths start at {Path.cwd()})"
    return f"{where}.path: {what} {pattern}{relative}"


def data_problems(data: Any) -> List[str]:
    """Every problem of a ``DataSpec``, one line each, naming the source (``data.train.1.path``)."""
    found = []
    for split in ("train", "eval"):
        given = getattr(data, split)
        if isinstance(given, list) and not given:
            found.append(f"data.{split}: an empty list; give one source, or a list of several to mix")
        sources = data.sources(split)
        for where, source in sources:
            found += _source_problems(where, source)
            found += _rename_problems(
                f"{where}.columns" if source.columns else "data.columns", {**data.columns, **source.columns}
            )
        weighted = [where for where, source in sources if source.weight is not None]
        if data.mix == "concatenate" and weighted:
            found.append(
                f"{weighted[0]}.weight: weights choose how often an interleaved mixture draws from each "
                "source; set data.mix: interleave, or drop the weights"
            )
        elif weighted and len(weighted) != len(sources):
            found.append(
                f"data.{split}: {', '.join(weighted)} have a weight and the other sources none; give every "
                "source a weight, or none (equal weights)"
            )
    found += seed_overlaps(data.sources("train"), data.sources("eval"))
    if data.mix == "interleave" and all(len(data.sources(split)) < 2 for split in ("train", "eval")):
        found.append(
            "data.mix: interleave draws from several sources; data.train (and data.eval) has one: give a "
            "list of sources, or drop mix"
        )
    return found


def _source_problems(where: str, source: Any) -> List[str]:
    if [source.path, source.name, source.reasoning_gym, source.verifiers].count(None) != 3:
        return [
            f"{where}: give exactly one of path (a local JSON/JSONL/Parquet/CSV file, a glob of them or a saved "
            "data set), name (a hub data set), reasoning_gym (generated tasks) or verifiers (a taskset's tasks)"
        ]
    found = []
    if source.reasoning_gym is not None:
        found += _generated_problems(f"{where}.reasoning_gym", source.reasoning_gym)
    kind = (
        "reasoning_gym" if source.reasoning_gym is not None else "verifiers" if source.verifiers is not None else None
    )
    if kind is not None:
        found += [
            f"{where}.{key}: applies to hub data sets ({where}.name); {kind} rows have none: remove it"
            for key, value in (("config", source.config), ("split", source.split))
            if value not in (None, "train")
        ]
    # a file is one split; save_to_disk's dict has several
    if source.path is not None:
        a_file = source.path.endswith(DATA_SUFFIXES)
        split = source.split if source.split != "train" and a_file else None
        found += [
            f"{where}.{key}: {cut(repr(value))} applies to hub data sets ({where}.name); a local file is one split: "
            "remove it"
            for key, value in (("config", source.config), ("split", split))
            if value is not None
        ]
    if source.max_rows is not None and source.max_rows < 1:
        found.append(f"{where}.max_rows: {source.max_rows}; expected at least 1 (the first rows kept), or drop it")
    if source.weight is not None and source.weight <= 0:
        found.append(f"{where}.weight: {source.weight}; expected a positive number (weights are normalised)")
    return found


def _generated_problems(where: str, generated: Any) -> List[str]:
    """A ``reasoning_gym`` source's problems the client can see: which tasks exist and what their configs take
    are the job's to check, where reasoning-gym is installed (``entrypoints/inputs/reasoning_tasks.py``)."""
    found = []
    if not generated.tasks:
        found.append(f"{where}.tasks: an empty list; name at least one task ({{name: chain_sum}})")
    names = [task.name for task in generated.tasks]
    found += [
        f"{where}.tasks: {name!r} is named twice; merge its configs"
        for name in sorted(set(names))
        if names.count(name) > 1
    ]
    found += [
        f"{where}.tasks.{index}.weight: {task.weight}; expected a positive number (weights are normalised)"
        for index, task in enumerate(generated.tasks)
        if task.weight <= 0
    ]
    found += [
        f"{where}.tasks.{index}.config: {key} is the source's ({where}.{key}); remove it from the config"
        for index, task in enumerate(generated.tasks)
        for key in ("size", "seed")
        if key in task.config
    ]
    if generated.size < 1:
        found.append(f"{where}.size: {generated.size}; expected at least 1 row")
    if not 0 <= generated.wrong_answers < 1:
        found.append(f"{where}.wrong_answers: {generated.wrong_answers}; expected a share in [0, 1)")
    if "{answer}" not in generated.answer_format:
        found.append(f"{where}.answer_format: {cut(repr(generated.answer_format))} has no {{answer}} to fill in")
    return found


def seed_ranges(generated: Any) -> Dict[str, range]:
    """The seeds each task's rows of a ``reasoning_gym`` source are drawn from: reasoning-gym draws row k of a task
    from its seed + k, and a composite's i-th task from the composite's seed + i + 1 (then + k)."""
    if len(generated.tasks) == 1:
        return {generated.tasks[0].name: range(generated.seed, generated.seed + generated.size)}
    return {
        task.name: range(generated.seed + index + 1, generated.seed + index + 1 + generated.size)
        for index, task in enumerate(generated.tasks)
    }


def seed_overlaps(train: List[Tuple[str, Any]], held_out: List[Tuple[str, Any]]) -> List[str]:
    """Generated sources of held-out data (``held_out``) that draw a task's rows from seeds training draws that task's
    rows from (``train``): the same rows, scored as if never seen. Each a pair of ``(dotted key, DataSource)``."""
    found = []
    for where, source in held_out:
        for trained_where, trained in train:
            if source.reasoning_gym is None or trained.reasoning_gym is None:
                continue
            ours, theirs = seed_ranges(source.reasoning_gym), seed_ranges(trained.reasoning_gym)
            shared = sorted(
                name
                for name in set(ours) & set(theirs)
                if max(ours[name].start, theirs[name].start) < min(ours[name].stop, theirs[name].stop)
            )
            if shared:
                past = max(theirs[name].stop for name in shared)
                found.append(
                    f"{where}.reasoning_gym.seed: {source.reasoning_gym.seed} draws {', '.join(shared)} rows from "
                    f"seeds {trained_where} trains on (reasoning-gym draws a task's row k from its seed + k): "
                    f"held-out rows need seeds of their own, e.g. {where}.reasoning_gym.seed: {past}"
                )
    return found


def _rename_problems(where: str, renames: Dict[str, str]) -> List[str]:
    onto: Dict[str, List[str]] = {}
    for column, renamed in renames.items():
        onto.setdefault(renamed, []).append(column)
    return [
        f"{where}: {', '.join(columns)} are all renamed to {renamed}; rename one to each name"
        for renamed, columns in onto.items()
        if len(columns) > 1
    ]
