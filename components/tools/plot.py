"""Training curves: one PNG of a run's ``metrics.jsonl``, or of several runs side by side.

    posttrain plot outputs/sft-tiny                                 # outputs/sft-tiny.png
    posttrain plot outputs/dpo-lr1e-5 outputs/dpo-lr1e-6 -o outputs/dpo.png

The figure is the one every job draws as its ``curves.png``
(``posttrain.entrypoints.records.curves``), one line per run on each metric's plot,
the legend naming each run by its directory.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence, Tuple

from posttrain.entrypoints.records.curves import METRICS_FILE, Series, draw, read_metrics, run_title, series


def run_of(directory: Path) -> Tuple[str, Series, Optional[str]]:
    """A run directory's label, plotted series, and title (from ``run_summary.json``, if there)."""
    title = None
    summary_path = directory / "run_summary.json"
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        title = run_title(summary["algorithm"], summary["spec"]["model"]["name_or_path"], summary["world_size"])
    return directory.name, series(read_metrics(directory / METRICS_FILE)), title


SUMMARY = "Training curves: one PNG of a run's metrics.jsonl, or of several runs side by side."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``posttrain plot``'s arguments on ``parser``."""
    parser.add_argument("output_dirs", nargs="+", type=Path, help=f"run directories holding {METRICS_FILE}")
    parser.add_argument(
        "-o", "--output", type=Path, help="the PNG to write (default: outputs/<each run's name, joined by ->.png)"
    )


def run(args: argparse.Namespace) -> int:
    """Draws the runs' curves into one PNG and prints its path; the exit code."""
    missing = [directory for directory in args.output_dirs if not (directory / METRICS_FILE).is_file()]
    if missing:
        print(f"posttrain plot: {missing[0]}: no {METRICS_FILE} (written by posttrain jobs)", file=sys.stderr)
        return 2
    names = [directory.name for directory in args.output_dirs]
    # outputs/ is where git looks away
    output = args.output or Path("outputs") / f"{'-'.join(names)}.png"
    runs, titles = [], []
    for directory in args.output_dirs:
        label, run_series, title = run_of(directory)
        # runs of the same name in different places are told apart by their paths
        runs.append((label if names.count(label) == 1 else str(directory), run_series))
        if title is not None and title not in titles:
            titles.append(title)
    output.parent.mkdir(parents=True, exist_ok=True)
    draw(runs, "\n".join(titles) or ", ".join(label for label, _ in runs), output)
    print(output)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m posttrain.components.tools.plot``: the same as ``posttrain plot``."""
    parser = argparse.ArgumentParser(prog="posttrain plot", description=SUMMARY)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
