"""Training data: loading and column checks, and fitting the batch to the data set's size."""

import logging
from pathlib import Path
from typing import Any, Dict, Sequence, Tuple, Type

from posttrain.components.fields import config_value
from posttrain.components.messages import SpecError
from posttrain.components.schema import DataSource, Spec

log = logging.getLogger("posttrain")


def load_data(
    source: DataSource, columns: Dict[str, str], where: str, formats: Sequence[Tuple[str, ...]]
) -> Any:
    """Loads a local file or hub data set, renames columns and checks them against ``formats`` (any one)."""
    import datasets

    datasets.disable_progress_bars()
    if source.path is not None:
        path = Path(source.path)
        if not path.is_file():
            raise SpecError([f"{where}.path: no such file: {path} (relative paths start at {Path.cwd()})"])
        builder = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}.get(path.suffix)
        if builder is None:
            raise SpecError([f"{where}.path: {path}: expected a .json, .jsonl, .parquet or .csv file"])
        try:
            dataset = datasets.load_dataset(builder, data_files=str(path), split="train")
        except Exception as error:  # noqa: BLE001 -- any parse failure is the user's file
            raise SpecError([f"{where}.path: cannot read {path}: {error}"]) from None
    else:
        dataset = datasets.load_dataset(source.name, source.config, split=source.split)
    renames = {found: expected for found, expected in columns.items() if found in dataset.column_names}
    missing = sorted(set(columns) - set(renames))
    if missing:
        raise SpecError([f"data.columns: {where} has no column {', '.join(missing)}; found {dataset.column_names}"])
    dataset = dataset.rename_columns(renames)
    if not any(set(cols) <= set(dataset.column_names) for cols in formats):
        expected = " or ".join("(" + ", ".join(cols) + ")" for cols in formats)
        raise SpecError(
            [f"{where}: found columns {dataset.column_names}; expected {expected} (map names with data.columns)"]
        )
    if len(dataset) == 0:
        raise SpecError([f"{where}: the data set is empty"])
    return dataset


def fit_batch(training: Dict[str, Any], config_class: str, rows: int, world_size: int) -> Dict[str, Any]:
    """Shrinks the per-device batch (then accumulation) so one global batch fits the data.

    ``world × per_device × accumulation`` rows larger than the data set make
    an empty data loader, which hangs distributed training.
    """
    per_device = config_value(config_class, training, "per_device_train_batch_size")
    accumulation = config_value(config_class, training, "gradient_accumulation_steps")
    if world_size * per_device * accumulation <= rows:
        return dict(training)
    if world_size > rows:
        raise SpecError(
            [f"data.train: {rows} rows cannot give each of the {world_size} processes one example; use more data"]
        )
    new_per_device = max(1, rows // (world_size * accumulation))
    new_accumulation = min(accumulation, max(1, rows // (world_size * new_per_device)))
    log.warning(
        "data.train has %d rows, fewer than one global batch (%d processes x %d per device x %d accumulation): "
        "using per_device_train_batch_size=%d, gradient_accumulation_steps=%d",
        rows, world_size, per_device, accumulation, new_per_device, new_accumulation,
    )  # fmt: skip
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
