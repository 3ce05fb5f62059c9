"""What an evaluation keeps in its output_dir between runs: its record (what its results depend on), each finished
prompt's result (``eval_parts/``, one file per process), and what a rerun does with them: go on, find them
finished, re-score them (only the scorers changed), sample them again (what they were sampled from changed), or
refuse another run's."""

import contextlib
import json
import logging
import shutil
from pathlib import Path
from typing import IO, Any, Dict, List, Optional, Set, Tuple

from posttrain.components.spec.loading import spec_diff
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.evaluation import trust
from posttrain.entrypoints.evaluation.files import PARTS_DIR, PLOT_FILE, SAMPLES_FILE, SPEC_FILE, SUMMARY_FILE
from posttrain.entrypoints.evaluation.scoring import result, scorer
from posttrain.entrypoints.process import distributed
from posttrain.entrypoints.records.checkpoints import read_record
from posttrain.entrypoints.records.files import replacing, write_json_atomic

log = logging.getLogger("posttrain")


def finished(output_dir: Path, record: Dict[str, Any], overwrite: bool) -> Tuple[Optional[str], bool]:
    """The closing line of this evaluation where ``output_dir`` holds it finished (None where there is nothing,
    this evaluation's parts to go on from, results out of date, or ``overwrite``), and whether what it holds is to
    be re-scored (its samples are this evaluation's, its scorers are not); raises where another run's results are
    there (another spec)."""
    written = output_dir / SPEC_FILE
    if not written.is_file():
        # overwrite_output_dir replaces another evaluation's results, never a training run
        held = [name for name in ("posttrain_spec.json", "run_summary.json") if (output_dir / name).exists()]
        if held:
            raise SpecError(
                [f"output_dir: {output_dir} holds a training run ({held[0]}); use another output_dir for the eval"]
            )
        return None, False
    differences = [key for key, _, _ in spec_diff(read_record(written, trust.REMEDY), record)]
    summary = output_dir / SUMMARY_FILE
    if differences and all(key.partition(".")[0] == "scorers" for key in differences):
        # only what is judged as this evaluation wrote it is re-scored: every rank says so alike
        if summary.is_file():
            trust.check_sealed(read_record(summary, trust.REMEDY, keys=("models",)), output_dir)
        return None, True
    if differences and overwrite:
        return None, False
    if differences and all(key.partition(".")[0] != "spec" for key in differences):
        # the same evaluation, what it samples from changed since (a model's weights, the data, a tool's code):
        # what it wrote is out of date, and start() clears it
        if distributed.is_rank0():
            log.warning("%s changed since its results were written: sampling them again", ", ".join(differences[:4]))
        return None, False
    if differences:
        raise SpecError(
            [
                f"output_dir: {output_dir} holds another evaluation's results (they differ in "
                f"{', '.join(differences[:4])}); use another output_dir, or overwrite_output_dir: true to replace them"
            ]
        )
    return (
        read_record(summary, trust.REMEDY, keys=("closing_line",))["closing_line"] if summary.is_file() else None
    ), False


def rescore(output_dir: Path, record: Dict[str, Any], prompts: Any, scorers: Dict[str, Any]) -> None:
    """Rank 0, where only the scorers changed: every completion kept (the finished samples, or the parts of an
    evaluation stopped half-way) scored again by this evaluation's scorers, as this evaluation's parts, and
    ``record`` written last; the benchmarks' results kept as they were. A kill on the way leaves what was kept:
    the next run re-scores it."""
    kept = parts(output_dir / PARTS_DIR)
    (output_dir / PARTS_DIR).mkdir(exist_ok=True)
    summary_path, samples_path = output_dir / SUMMARY_FILE, output_dir / SAMPLES_FILE
    if summary_path.is_file() and samples_path.is_file():
        # sealed: finished() checked it
        summary = read_record(summary_path, trust.REMEDY, keys=("models",))
        kept += _results_of(samples_path)
        for model, results in summary.get("benchmarks", {}).items():
            write_json_atomic(output_dir / PARTS_DIR / f"benchmarks-{model}.json", results)
    log.info("the scorers changed: re-scoring the %d prompt result(s) kept, without sampling again", len(kept))
    functions = {name: scorer(resolved) for name, resolved in scorers.items()}
    rescored = [result(r["model"], r["index"], prompts[r["index"]], r["completions"], functions) for r in kept]
    # read after the others (_parts reads them in order, a later result of a prompt replacing an earlier)
    written = output_dir / PARTS_DIR / "rank-rescored.jsonl"
    # whole or not at all: it may be the only copy of the completions (a kill after the rest was removed)
    with replacing(written) as staging, open(staging, "w") as part:
        part.writelines(json.dumps(line) + "\n" for line in rescored)
    for path in (output_dir / PARTS_DIR).glob("rank-*.jsonl"):
        if path != written:
            path.unlink()
    for name in (SUMMARY_FILE, SAMPLES_FILE, PLOT_FILE):
        (output_dir / name).unlink(missing_ok=True)
    write_json_atomic(output_dir / SPEC_FILE, record)


def _results_of(samples: Path) -> List[Dict[str, Any]]:
    """A finished evaluation's samples as the prompt results they were summarised from (completions in order)."""
    results: Dict[Tuple[str, int], Dict[str, Any]] = {}
    for line in samples.read_text().splitlines():
        sample = json.loads(line)
        key = (sample["model"], sample["index"])
        results.setdefault(key, {"model": key[0], "index": key[1], "completions": []})
        results[key]["completions"].append(sample["completion"])
    return list(results.values())


def start(output_dir: Path, record: Dict[str, Any]) -> None:
    """Rank 0: a fresh directory for a new evaluation (another's results cleared), or this one's to go on with."""
    written = output_dir / SPEC_FILE
    if not (written.is_file() and not spec_diff(json.loads(written.read_text()), record)):
        for name in (SUMMARY_FILE, SAMPLES_FILE, PLOT_FILE):
            (output_dir / name).unlink(missing_ok=True)
        shutil.rmtree(output_dir / PARTS_DIR, ignore_errors=True)
        write_json_atomic(written, record)
    (output_dir / PARTS_DIR).mkdir(exist_ok=True)


def parts(parts_dir: Path) -> List[Dict[str, Any]]:
    """Every prompt's result written so far, by any process of any run of this evaluation; a line a kill cut short
    is not one."""
    found = []
    for path in sorted(parts_dir.glob("rank-*.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                found.append(json.loads(line))
    return found


def part(path: Path) -> IO[str]:
    """This rank's part file, to append to: a last line a kill cut short (no newline) is cut off first, so the next
    result starts a line of its own."""
    if path.is_file():
        text = path.read_bytes()
        if text and not text.endswith(b"\n"):
            with open(path, "r+b") as cut:
                cut.truncate(text.rfind(b"\n") + 1)
    return open(path, "a")


def write(part: IO[str], result: Dict[str, Any]) -> None:
    part.write(json.dumps(result) + "\n")
    part.flush()


def done(parts_dir: Path) -> Set[Tuple[str, int]]:
    return {(result["model"], result["index"]) for result in parts(parts_dir)}
