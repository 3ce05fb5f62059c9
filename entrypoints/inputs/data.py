"""Training data: loading and checks, and fitting the batch to the data set's size.

Every problem of the data is one line naming the file and, where it has
one, the line, byte or row: an empty file, bytes that are not UTF-8, a
corrupt JSON line, missing columns, values of the wrong kind or null,
preference pairs whose chosen answer is the rejected one.
"""

import logging
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Type

from posttrain.components.spec.data_sources import is_glob, matched_paths, missing_path
from posttrain.components.spec.fields import config_value
from posttrain.components.spec.local_files import (
    check_text,
    column_problem,
    json_error,
    not_a_data_file,
    not_a_saved_data_set,
)
from posttrain.components.spec.messages import SpecError, first_line
from posttrain.components.spec.schema import Spec
from posttrain.components.spec.sections import DataSource, DataSpec
from posttrain.entrypoints.inputs.reasoning_tasks import generated_rows
from posttrain.entrypoints.inputs.verifiers_tasks import taskset_rows
from posttrain.entrypoints.process.distributed import env_rank

log = logging.getLogger("posttrain")


def load_split(data: DataSpec, formats: Sequence[Tuple[str, ...]], split: str, seed: int) -> Any:
    """``data.train`` or ``data.eval``: its one source, or its sources loaded and checked one by one (each message
    naming its source, ``data.train.1``) against the algorithm's column sets ``formats``, then concatenated or
    interleaved (``data.mix``)."""
    loaded = [
        (where, source, load_data(source, {**data.columns, **source.columns}, where, formats))
        for where, source in data.sources(split)
    ]
    dataset = loaded[0][2] if len(loaded) == 1 else mix(loaded, data.mix, formats, seed)
    return as_chat(dataset, data.chat.system) if data.chat is not None else dataset


def as_chat(dataset: Any, system: Optional[str]) -> Any:
    """``data.chat``: each text prompt as chat messages, the ``system`` message (if any) first, then the prompt as
    the user's; prompts that are chat messages already stay as they are."""
    if "prompt" not in dataset.column_names:
        return dataset
    opening = [{"role": "system", "content": system}] if system is not None else []

    def wrap(row: Dict[str, Any]) -> Dict[str, Any]:
        prompt = row["prompt"]
        return {"prompt": prompt if not isinstance(prompt, str) else [*opening, {"role": "user", "content": prompt}]}

    return dataset.map(wrap)


def mix(loaded: Sequence[Tuple[str, Any, Any]], how: str, formats: Sequence[Tuple[str, ...]], seed: int) -> Any:
    """Several sources' data sets as one: the columns every source has (among them a set the algorithm reads),
    each cast to the first's features, then concatenated in order or interleaved as ``datasets.interleave_datasets``
    draws (weights normalised, until every source is used up)."""
    import datasets

    shared = [name for name in loaded[0][2].column_names if all(name in ds.column_names for _, _, ds in loaded)]
    if not any(set(columns) <= set(shared) for columns in formats):
        has = "; ".join(f"{where} has {', '.join(ds.column_names)}" for where, _, ds in loaded)
        expected = " or ".join("(" + ", ".join(columns) + ")" for columns in formats)
        raise SpecError(
            [
                f"{loaded[0][0].rsplit('.', 1)[0]}: its sources share none of the column sets {expected} "
                f"({has}); rename them to one set (each source's columns)"
            ]
        )
    first_where, _, first = loaded[0]
    features = first.select_columns(shared).features
    parts = []
    for part_where, _, dataset in loaded:
        try:
            parts.append(dataset.select_columns(shared).cast(features))
        except (ValueError, TypeError) as error:
            raise SpecError(
                [
                    f"{part_where}: its columns do not hold what {first_where}'s do ({first_line(error)}); "
                    "give every source of a mixture the same columns and kinds"
                ]
            ) from None
    if how == "concatenate":
        return datasets.concatenate_datasets(parts)
    weights = [source.weight or 1.0 for _, source, _ in loaded]
    probabilities = [weight / sum(weights) for weight in weights]
    return datasets.interleave_datasets(parts, probabilities, seed=seed, stopping_strategy="all_exhausted")


def load_data(source: DataSource, columns: Dict[str, str], where: str, formats: Sequence[Tuple[str, ...]]) -> Any:
    """Loads a local file, a glob of files, a saved data set or a hub data set, keeps its first ``max_rows``,
    renames columns and checks them against ``formats`` (any one).

    Then what the trainer would trip over later, deep in a traceback: values
    of the wrong kind, nulls, preference pairs that are no pair.
    """
    import datasets

    datasets.disable_progress_bars()
    if source.reasoning_gym is not None:
        path = None
        dataset = generated_rows(source.reasoning_gym, f"{where}.reasoning_gym")
    elif source.verifiers is not None:
        path = None
        dataset = taskset_rows(source.verifiers, f"{where}.verifiers")
    elif source.path is not None:
        path = Path(source.path)
        is_saved = path.is_dir() and not is_glob(source.path)
        dataset = (
            _load_saved(path, source.split, where, datasets) if is_saved else _load_files(source.path, where, datasets)
        )
    else:
        path = None
        dataset = _load_hub(source, where, datasets)
    if source.max_rows is not None and len(dataset) > source.max_rows:
        dataset = dataset.select(range(source.max_rows))
    problem = column_problem(dataset.column_names, columns, formats, where)
    if problem is not None:
        raise SpecError([problem])
    dataset = dataset.rename_columns(columns)
    matched = [cols for cols in formats if set(cols) <= set(dataset.column_names)]
    if len(dataset) == 0:
        raise SpecError([f"{where}: {path} is empty" if path is not None else f"{where}: the data set is empty"])
    for column in sorted({column for cols in matched for column in cols}):
        check_column(dataset, column, where)
    check_pairs(dataset, where)
    return dataset


def _load_files(pattern: str, where: str, datasets: Any) -> Any:
    """A local file, or the files a glob matches (one kind), through datasets' builder for their suffix, their
    problems said in one line each, naming the file."""
    paths = matched_paths(pattern)
    if not paths or (not is_glob(pattern) and not paths[0].is_file()):
        raise SpecError([missing_path(pattern, where)])
    builders = {path: _BUILDERS.get(path.suffix) for path in paths}
    for path, builder in builders.items():
        if builder is None:
            raise not_a_data_file(path, where)
    if len(set(builders.values())) > 1:
        raise SpecError(
            [
                f"{where}.path: {pattern} matches files of several kinds ({', '.join(sorted({p.suffix for p in paths}))}); "
                "give each kind its own source"
            ]
        )
    builder = builders[paths[0]]
    for path in paths:
        if builder != "parquet":
            check_text(path, where)
    verbosity = datasets.logging.get_verbosity()
    # its "Failed to load JSON" line: ours says it once
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        return datasets.load_dataset(builder, data_files=[str(path) for path in paths], split="train")
    except Exception as error:  # noqa: BLE001 -- any parse failure is the user's file
        # datasets reports a row of a block; the line is what a user can find
        for path in paths if builder == "json" else []:
            bad_line = json_error(path.read_text(encoding="utf-8"))
            if bad_line is not None:
                raise SpecError([f"{where}.path: {path} {bad_line}"]) from None
        path = paths[0] if len(paths) == 1 else pattern
        # datasets wraps the reader's error ("An error occurred while generating the dataset"): say the reader's
        reason = error.__cause__ or error.__context__ or error
        raise SpecError([f"{where}.path: cannot read {path}: {first_line(reason)}"]) from None
    finally:
        datasets.logging.set_verbosity(verbosity)


_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def _load_saved(path: Path, split: str, where: str, datasets: Any) -> Any:
    """A directory ``save_to_disk`` wrote: a data set, or a dict of them (``split`` picks one)."""
    problem = not_a_saved_data_set(path, where)
    if problem is not None:
        raise problem
    try:
        loaded = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as error:
        raise SpecError([f"{where}.path: cannot read {path}: {first_line(error)}"]) from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise SpecError([f"{where}.split: {path} has no split {split!r}; it has {', '.join(loaded)}"])
        return loaded[split]
    return loaded


def _load_hub(source: DataSource, where: str, datasets: Any) -> Any:
    """A hub data set's split; an unknown name, config or split, or an unreachable hub, said in one line."""
    try:
        return datasets.load_dataset(source.name, source.config, split=source.split)
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as error:
        named = f"{source.name!r}" + (f" (config {source.config!r})" if source.config else "")
        raise SpecError([f"{where}.name: cannot load split {source.split!r} of {named}: {first_line(error)}"]) from None


TEXT_OR_CHAT = "text or chat messages (a list of {role, content})"
# what each column the trainers read must hold (after data.columns renames)
EXPECTED_KINDS: Dict[str, str] = {
    "prompt": TEXT_OR_CHAT,
    "chosen": TEXT_OR_CHAT,
    "rejected": TEXT_OR_CHAT,
    "completion": TEXT_OR_CHAT,
    "messages": "chat messages (a list of {role, content})",
    "text": "text",
    "label": "true/false",
}


def _is_chat(value: Any) -> bool:
    """Chat messages: each with a role, and content or (an assistant's) tool calls."""
    return isinstance(value, list) and all(
        isinstance(m, dict) and "role" in m and ("content" in m or "tool_calls" in m) for m in value
    )


_VALUE_FITS: Dict[str, Callable[[Any], bool]] = {
    TEXT_OR_CHAT: lambda value: isinstance(value, str) or _is_chat(value),
    EXPECTED_KINDS["messages"]: _is_chat,
    "text": lambda value: isinstance(value, str),
    "true/false": lambda value: isinstance(value, bool),
}


def _feature_kind(feature: Any) -> str:
    """What a column's feature holds, in the words of EXPECTED_KINDS where it is one of them."""
    from datasets import Value

    if isinstance(feature, Value):
        dtype = feature.dtype
        if dtype in ("string", "large_string"):
            return "text"
        if dtype == "bool":
            return "true/false"
        if dtype.startswith(("int", "uint", "float", "double")):
            return f"numbers ({dtype})"
        return "nulls only" if dtype == "null" else dtype
    # List, LargeList
    inner = getattr(feature, "feature", None)
    # chat messages: each with a role, and content or (an assistant's) tool calls
    if isinstance(inner, dict) and "role" in inner and {"content", "tool_calls"} & set(inner):
        return EXPECTED_KINDS["messages"]
    if inner is not None:
        return "lists of objects" if isinstance(inner, dict) else f"lists of {_feature_kind(inner)}"
    return "objects" if isinstance(feature, dict) else type(feature).__name__


def _value_kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"true/false ({value})"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    return {str: "text", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def check_column(dataset: Any, column: str, where: str) -> None:
    """The column holds what the trainers expect, in every row: by its feature, row by row only for mixed JSON."""
    import pyarrow as pa
    import pyarrow.compute as pc

    expected = EXPECTED_KINDS.get(column)
    if expected is None:
        return
    feature = dataset.features[column]
    # rows of different kinds, or messages of different shapes (tool calls and their results): the first that
    # does not fit
    if "Json" in (type(feature).__name__, type(getattr(feature, "feature", None)).__name__):
        fits = _VALUE_FITS[expected]
        for row, value in enumerate(dataset[column], 1):
            if value is not None and not fits(value):
                held = _value_kind(value)
                raise SpecError([f"{where}: column {column} holds {held} in row {row}; expected {expected}"])
    else:
        kind = _feature_kind(feature)
        fits_all = kind == expected or (expected == TEXT_OR_CHAT and kind in ("text", EXPECTED_KINDS["messages"]))
        if not fits_all:
            raise SpecError([f"{where}: column {column} holds {kind}; expected {expected}"])
    values = dataset.data.column(column)
    if values.null_count:
        first = pc.index(pc.is_null(values), True).as_py() + 1
        raise SpecError(
            [
                f"{where}: column {column} is missing or null in {values.null_count} of {len(dataset)} rows "
                f"(the first: row {first})"
            ]
        )
    # nothing to condition on; a tokenizer that adds no BOS makes it no token at all
    if column == "prompt":
        kind = values.type
        lengths = (
            pc.utf8_length(pc.utf8_trim_whitespace(values))
            if kind in (pa.string(), pa.large_string())
            else (pc.list_value_length(values) if pa.types.is_list(kind) or pa.types.is_large_list(kind) else None)
        )
        empty = [] if lengths is None else [row for row, length in enumerate(lengths.to_pylist(), 1) if length == 0]
        if empty:
            shown = ", ".join(map(str, empty[:5])) + (", ..." if len(empty) > 5 else "")
            raise SpecError(
                [
                    f"{where}: column prompt is empty in {len(empty)} of {len(dataset)} rows (rows {shown}); "
                    "give every row a prompt, or drop those rows"
                ]
            )


def check_pairs(dataset: Any, where: str) -> None:
    """A preference pair whose chosen answer equals the rejected one teaches nothing: all such is an error.

    A few such pairs (ties in a real data set) only dilute the batch: a warning
    with their count.
    """
    if not {"chosen", "rejected"} <= set(dataset.column_names):
        return
    chosen, rejected = dataset.data.column("chosen"), dataset.data.column("rejected")
    if _feature_kind(dataset.features["chosen"]) == "text" == _feature_kind(dataset.features["rejected"]):
        import pyarrow.compute as pc

        same = [bool(equal) for equal in pc.equal(chosen, rejected).fill_null(False).to_pylist()]
    else:
        # chat messages: compared as Python lists
        same = [a == b for a, b in zip(chosen.to_pylist(), rejected.to_pylist())]
    count = sum(same)
    if count == len(same):
        raise SpecError(
            [f"{where}: chosen equals rejected in every row ({count}); a preference pair needs two different answers"]
        )
    # a warning, not an error: rank 0's alone
    if count and env_rank() == 0:
        log.warning(
            "%s: chosen equals rejected in %d of %d rows (the first: row %d); those pairs teach nothing",
            where,
            count,
            len(same),
            same.index(True) + 1,
        )


def fit_batch(
    training: Dict[str, Any], config_class: str, rows: int, world_size: int, min_per_device: int = 1
) -> Dict[str, Any]:
    """Shrinks the per-device batch (then accumulation) so one global batch fits the data.

    ``world × per_device × accumulation`` rows larger than the data set make
    an empty data loader, which hangs distributed training. The batch stays at
    ``min_per_device`` or more (the spec's ``min_per_device_batch``).
    """
    per_device = config_value(config_class, training, "per_device_train_batch_size")
    accumulation = config_value(config_class, training, "gradient_accumulation_steps")
    if world_size * per_device * accumulation <= rows:
        return dict(training)
    if world_size * min_per_device > rows:
        examples = "one example" if min_per_device == 1 else f"{min_per_device} examples (the trainer's least)"
        raise SpecError(
            [f"data.train: {rows} rows cannot give each of the {world_size} processes {examples}; use more data"]
        )
    new_per_device = max(min_per_device, rows // (world_size * accumulation))
    new_accumulation = min(accumulation, max(1, rows // (world_size * new_per_device)))
    # every rank shrinks alike; one says so
    if env_rank() == 0:
        log.warning(
            "data.train has %d rows, fewer than one global batch (%d processes x %d per device x %d accumulation): "
            "using per_device_train_batch_size=%d, gradient_accumulation_steps=%d",
            rows,
            world_size,
            per_device,
            accumulation,
            new_per_device,
            new_accumulation,
        )
    return {
        **training,
        "per_device_train_batch_size": new_per_device,
        "gradient_accumulation_steps": new_accumulation,
    }


def check_online_data(algorithm: Type[Spec], args: Any, rows: int, world_size: int) -> None:
    """Enough prompts for one batch of a generating algorithm (its batch is checked, never shrunk).

    Grouping algorithms (GRPO, RLOO) take ``generation_batch_size /
    num_generations`` prompts; the other generating ones (PPO) one prompt per
    sample of every rank's batch.
    """
    if algorithm.groups:
        needed = args.generation_batch_size // args.num_generations
        how = f"{args.generation_batch_size} completions / {args.num_generations} per prompt"
    elif algorithm.generates:
        needed = args.per_device_train_batch_size * world_size
        how = f"{args.per_device_train_batch_size} per process x {world_size} processes"
    else:
        return
    if rows < needed:
        raise SpecError(
            [
                f"data.train: {rows} prompts, fewer than one batch takes ({how} = {needed}); use more prompts, "
                "or lower per_device_train_batch_size or the number of processes"
            ]
        )


def longest_prompt(
    tokenizer: Any, dataset: Any, tools: Sequence[Any] = (), chat_template_kwargs: Optional[Dict[str, Any]] = None
) -> int:
    """The longest of ``dataset``'s prompts in tokens, tokenized as TRL 1.16's GRPO and RLOO trainers do
    (``_tokenize_prompts``): chat prompts through the chat template (TRL's prefix-preserving one with tools where the
    model's is not), with the generation prompt, ``tools``' schemas and ``chat_template_kwargs``; text as it is,
    special tokens added. (An environment's own tools are left out.)"""
    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving
    from trl.data_utils import is_conversational

    prompts = list(dataset["prompt"])
    if is_conversational({"prompt": prompts[0]}):
        template = None
        if tools and not is_chat_template_prefix_preserving(tokenizer):
            template = get_training_chat_template(tokenizer)
        ids = tokenizer.apply_chat_template(
            conversation=prompts,
            tools=list(tools) or None,
            chat_template=template,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **(chat_template_kwargs or {}),
        )["input_ids"]
    else:
        ids = tokenizer(text=prompts)["input_ids"]
    return max(len(row) for row in ids)


def check_length_column(rows_hold_input_ids: bool, args: Any, datasets: Sequence[Tuple[str, Any]]) -> None:
    """The lengths that length-grouped sampling reads: transformers measures each row's input_ids, which only some
    trainers' tokenised rows hold (the spec class's ``rows_hold_input_ids``); the others' data gives them in
    ``length_column_name`` (the evaluation's too, with group_by_length), else the first batch fails with a
    ValueError."""
    strategy = args.train_sampling_strategy
    if rows_hold_input_ids or strategy not in ("group_by_length", "batch_rebalance"):
        return
    column = args.length_column_name
    for where, dataset in datasets if strategy == "group_by_length" else datasets[:1]:
        if column not in dataset.column_names:
            raise SpecError(
                [
                    f"{where}: train_sampling_strategy: {strategy} reads each row's length (in tokens) from column "
                    f"{column!r}, which {where} does not have; add it (training.length_column_name names it), or "
                    "set train_sampling_strategy: random"
                ]
            )


def check_loss_masks(args: Any, datasets: Sequence[Tuple[str, Any]]) -> None:
    """SFT's loss masks find the rows they mask: the completion's mask needs prompt and completion (TRL trains on
    every token of other rows, without a word), the assistant's needs chat messages (TRL raises, models loaded)."""
    for where, dataset in datasets:
        columns, first = dataset.column_names, dataset[0]
        if getattr(args, "completion_only_loss", None) is True and not {"prompt", "completion"} <= set(columns):
            raise SpecError(
                [
                    f"training.completion_only_loss: true masks the prompt of prompt/completion rows, and {where} has "
                    f"{', '.join(columns)}: every token would count; for chat messages set assistant_only_loss: true"
                ]
            )
        chat = [column for column in ("messages", "prompt", "completion") if column in first]
        if getattr(args, "assistant_only_loss", False) and not (chat and all(_is_chat(first[c]) for c in chat)):
            raise SpecError(
                [
                    f"training.assistant_only_loss: true masks all but the assistant's turns of chat messages, and {where} "
                    "has plain text; drop it, or give messages (or prompt and completion as messages)"
                ]
            )
