"""`posttrain plot`, in a process of its own, draws two runs side by side; the client imports no matplotlib."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

from helpers import POSTTRAIN, assert_valid_png, lines
from posttrain.entrypoints.records import curves


def write_run(directory: Path, algorithm: str, records: List[Dict[str, Any]]) -> None:
    directory.mkdir(parents=True)
    (directory / curves.METRICS_FILE).write_text("".join(json.dumps(record) + "\n" for record in records))
    summary = {"algorithm": algorithm, "world_size": 1, "spec": {"model": {"name_or_path": "builtin:tiny-llama"}}}
    (directory / "run_summary.json").write_text(json.dumps(summary))


def test_the_plot_command_draws_two_runs_side_by_side(tmp_path: Path) -> None:
    write_run(tmp_path / "grpo-a", "grpo", [{"step": s, "loss": 0.1 * s, "reward": s, "kl": 0.01} for s in (1, 2, 3)])
    write_run(tmp_path / "grpo-b", "grpo", [{"step": s, "loss": 0.2 * s, "reward": -s} for s in (1, 2)])
    output = tmp_path / "both.png"
    result = subprocess.run(
        [POSTTRAIN, "plot", str(tmp_path / "grpo-a"), str(tmp_path / "grpo-b"), "-o", str(output)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["both.png", "grpo-a", "grpo-b"]
    # no -o: under outputs/, ignored
    plot = [POSTTRAIN, "plot", "grpo-a", "grpo-b"]
    result = subprocess.run(plot, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout == "outputs/grpo-a-grpo-b.png\n", result.stderr
    assert assert_valid_png(tmp_path / "outputs" / "grpo-a-grpo-b.png")["runs"].keys() == {"grpo-a", "grpo-b"}
    data = assert_valid_png(output)
    assert data["title"] == "grpo · builtin:tiny-llama · 1 process"
    assert data["runs"]["grpo-a"] == curves.series(lines(tmp_path / "grpo-a" / curves.METRICS_FILE))
    assert data["runs"]["grpo-b"] == {
        "loss": {"step": [1, 2], "value": [0.2, 0.4]},
        "reward": {"step": [1, 2], "value": [-1.0, -2.0]},
    }


def test_the_client_imports_no_matplotlib() -> None:
    code = (
        # as if not installed
        "import sys; sys.modules['matplotlib'] = None\nimport posttrain.components, posttrain.components.tools.cli\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_posttrain_command_names_its_commands_and_refuses_a_run_without_metrics(tmp_path: Path) -> None:
    helped = subprocess.run([POSTTRAIN, "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "{templates,plot}" in helped.stdout, helped.stderr
    for command in ("templates", "plot"):
        assert subprocess.run([POSTTRAIN, command, "--help"], capture_output=True, timeout=120).returncode == 0
    refused = subprocess.run([POSTTRAIN, "plot", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr == f"posttrain plot: {tmp_path}: no metrics.jsonl (written by posttrain jobs)\n"
