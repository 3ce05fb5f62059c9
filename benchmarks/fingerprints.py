"""What knowing a run's inputs by content costs (``entrypoints/records/fingerprints.py``), once per job: no step pays.

``python -m benchmarks.fingerprints`` measures, each in a fresh process (as a job computes them, before any model
loads; the files in the page cache, as a rerun finds them):

- every shipped tiny template's ``checkpoints.job_inputs``: its data files and models (built-ins: by name);
- a local model directory of ``--gib`` GiB of weights in shards of 1 GiB (random bytes), read the first time (no
  record) and again by a later run that finds the first run's record (``seen``) with the files unchanged.

Medians of ``--repeats`` runs.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
SHARD = 1 << 30


def measure_templates() -> Dict[str, float]:
    """Seconds of job_inputs per tiny template (its data and models as the job reads them)."""
    from posttrain.components.spec.loading import load_spec
    from posttrain.entrypoints.job.spec_parts import parts
    from posttrain.entrypoints.records.checkpoints import job_inputs

    batch = {"processes": 1, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1}
    figures = {}
    for path in sorted((REPO / "templates").glob("*/tiny*.yaml")):
        if path.parent.name in ("chain", "eval"):
            continue
        spec = load_spec(str(path.relative_to(REPO)))
        splits = [("data.train", None)] + ([("data.eval", None)] if spec.data.eval is not None else [])
        started = time.perf_counter()
        job_inputs(parts(spec).resume, batch, splits)
        figures[str(path.relative_to(REPO / "templates"))] = time.perf_counter() - started
    return figures


def measure_model(model: Path, record: Path) -> Dict[str, float]:
    """Seconds of a model directory's fingerprint, taking the digests ``record`` kept (if any), then keeping them."""
    from posttrain.entrypoints.records import fingerprints

    if record.exists():
        fingerprints.remember(json.loads(record.read_text()))
    started = time.perf_counter()
    fingerprints.model_fingerprint(str(model))
    seconds = time.perf_counter() - started
    record.write_text(json.dumps({"seen": fingerprints.seen()}))
    return {"seconds": seconds}


def in_a_process(*args: str) -> Dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.fingerprints", "--run", *args]
    output = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True).stdout
    return json.loads(output.rsplit("FIGURES ", 1)[1])


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fingerprints", description=__doc__)
    parser.add_argument("--gib", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--run", nargs="*", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.run is not None:
        figures = measure_templates() if options.run == ["templates"] else measure_model(*map(Path, options.run))
        print("FIGURES " + json.dumps(figures), flush=True)
        return
    templates: Dict[str, List[float]] = {}
    for _ in range(options.repeats):
        for name, seconds in in_a_process("templates").items():
            templates.setdefault(name, []).append(seconds)
    print("| tiny template | job_inputs (ms, median) |\n| --- | ---: |")
    for name, values in templates.items():
        print(f"| {name} | {statistics.median(values) * 1000:.1f} |")

    with tempfile.TemporaryDirectory(prefix="bench-fingerprints-") as scratch:
        model = Path(scratch) / "model"
        model.mkdir()
        for index in range(options.gib):
            (model / f"model-{index + 1:05d}-of-{options.gib:05d}.safetensors").write_bytes(os.urandom(SHARD))
        (model / "config.json").write_text("{}")
        first, again = [], []
        for repeat in range(options.repeats):
            record = Path(scratch) / f"record-{repeat}.json"
            first.append(in_a_process(str(model), str(record))["seconds"])
            again.append(in_a_process(str(model), str(record))["seconds"])
    size = options.gib * SHARD / 1e9
    read = statistics.median(first)
    print(f"\n| {options.gib} GiB model | seconds (median) | GB/s |\n| --- | ---: | ---: |")
    print(f"| read whole (no record) | {read:.2f} | {size / read:.2f} |")
    print(f"| a later run, files unchanged (its record) | {statistics.median(again):.4f} | |")


if __name__ == "__main__":
    main()
