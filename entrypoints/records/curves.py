"""Training curves: a run's ``metrics.jsonl`` and the figure of one or several runs (``curves.png``).

Every job draws its own ``curves.png`` at the end with :func:`draw` (the
``MetricsLog`` callback); ``posttrain plot`` draws the same figure from runs'
directories, one line per run on each metric's plot.
The plotted series are embedded in the PNG as JSON (text chunk
:data:`DATA_KEY`), so the figure's data can be checked or reused.

matplotlib is imported only inside :func:`draw`: the plot command's module
loads without it.
"""

import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from posttrain.entrypoints.records.files import replacing

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
DATA_KEY = "posttrain:series"

# What is plotted, in this order, where logged. Algorithms name the same quantity differently:
# TRL's GRPO/RLOO log `reward`, our PPO `objective/scores`; DPO `rewards/margins`, the reward trainer `margin`.
PLOTTED = (
    "loss",
    "eval_loss",
    "reward",
    "objective/scores",
    "rewards/margins",
    "rewards/accuracies",
    "margin",
    "accuracy",
    "kl",
    "objective/kl",
    # GRPO with tools: how often the model calls them, and how often a call fails
    "tools/call_frequency",
    "tools/failure_frequency",
    # with the vllm role: how old the samples trained on were, and how long the trainers waited for them
    "generation/staleness_max",
    "generation/trainer_wait_s",
    "learning_rate",
)

# {metric: {"step": [...], "value": [...]}}
Series = Dict[str, Dict[str, List[float]]]


def read_metrics(path: Path) -> List[Dict[str, Any]]:
    """The records of a ``metrics.jsonl``; a line torn by a crash mid-write is skipped."""
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "step" in record:
            records.append(record)
    return records


def series(records: Sequence[Mapping[str, Any]]) -> Series:
    """The plotted metrics' values against the step, in :data:`PLOTTED` order.

    >>> series([{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5, "eval_loss": 1.7}])
    {'loss': {'step': [1, 2], 'value': [2.0, 1.5]}, 'eval_loss': {'step': [2], 'value': [1.7]}}
    """
    found: Series = {}
    for metric in PLOTTED:
        points = [(r["step"], r[metric]) for r in records if _is_number(r.get(metric))]
        if points:
            found[metric] = {"step": [s for s, _ in points], "value": [float(v) for _, v in points]}
    return found


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def run_title(algorithm: str, model: str, world_size: int) -> str:
    """``sft · builtin:tiny-llama · 2 processes``: what ran, for a figure's title."""
    return f"{algorithm} · {model} · {world_size} process{'es' if world_size != 1 else ''}"


def draw(runs: Sequence[Tuple[str, Series]], title: str, path: Path) -> Dict[str, Any]:
    """Writes the figure of ``runs`` (label, series) to ``path``, atomically; returns the embedded data.

    One plot per metric any run logged, one line per run on it.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    # not pyplot: no global state, no GUI backend
    from matplotlib.figure import Figure

    metrics = [m for m in PLOTTED if any(m in run_series for _, run_series in runs)]
    columns = min(3, max(len(metrics), 1))
    rows = max(-(-len(metrics) // columns), 1)
    figure = Figure(figsize=(5 * columns, 3.4 * rows + 0.6), layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(title)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, metric in zip(axes, metrics):
        for label, run_series in runs:
            if metric in run_series:
                points = run_series[metric]
                # markers make short runs' points visible
                few = len(points["step"]) <= 30
                ax.plot(points["step"], points["value"], marker="." if few else None, label=label)
        ax.set_title(metric)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(runs) > 1:
            ax.legend(fontsize="small")
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    # e.g. logging_steps past max_steps: an empty figure would look broken
    if not metrics:
        axes[0].set_visible(True)
        axes[0].text(0.5, 0.5, "no metrics logged", ha="center", va="center", transform=axes[0].transAxes)
    data = {"title": title, "runs": {label: run_series for label, run_series in runs}}
    with replacing(path) as temporary:
        figure.savefig(temporary, format="png", dpi=100, metadata={DATA_KEY: json.dumps(data)})
    return data


def read_embedded(path: Path) -> Dict[str, Any]:
    """The data :func:`draw` embedded in a PNG."""
    # matplotlib's own PNG writer
    from PIL import Image

    with Image.open(path) as image:
        return json.loads(image.text[DATA_KEY])
