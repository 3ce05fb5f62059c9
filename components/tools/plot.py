"""Training curves: one PNG of a run's ``metrics.jsonl``, or of several runs side by side.

    python -m posttrain.components.tools.plot outputs/sft-tiny                          # outputs/sft-tiny.png
    python -m posttrain.components.tools.plot outputs/dpo-lr1e-5 outputs/dpo-lr1e-6 -o outputs/dpo.png

The figure is the one every job draws as its ``curves.png``
(``posttrain.entrypoints.records.curves``), one line per run on each metric's plot,
the legend naming each run by its directory.
"""

import argparse
import json
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


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m posttrain.components.tools.plot", description=__doc__.split("\n")[0]
    )
    parser.add_argument("output_dirs", nargs="+", type=Path, help=f"run directories holding {METRICS_FILE}")
    parser.add_argument(
        "-o", "--output", type=Path, help="the PNG to write (default: outputs/<each run's name, joined by ->.png)"
    )
    options = parser.parse_args(argv)
    names = [directory.name for directory in options.output_dirs]
    # outputs/ is where git looks away
    output = options.output or Path("outputs") / f"{'-'.join(names)}.png"
    runs, titles = [], []
    for directory in options.output_dirs:
        if not (directory / METRICS_FILE).is_file():
            parser.error(f"{directory}: no {METRICS_FILE} (written by posttrain jobs)")
        label, run_series, title = run_of(directory)
        # runs of the same name in different places are told apart by their paths
        runs.append((label if names.count(label) == 1 else str(directory), run_series))
        if title is not None and title not in titles:
            titles.append(title)
    output.parent.mkdir(parents=True, exist_ok=True)
    draw(runs, "\n".join(titles) or ", ".join(label for label, _ in runs), output)
    print(output)


if __name__ == "__main__":
    main()
