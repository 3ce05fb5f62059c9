"""The SFT benchmark, end to end on CPU: the command a lent GPU runs first (``benchmarks/gpu_lease.sh``) works here.

A small configuration of ``python -m benchmarks.sft``: both sides train
(posttrain through ``torchx run``, the plain TRL script through torchrun), the
figures come back, and the losses agree step by step.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

pytestmark = pytest.mark.e2e


def test_the_sft_benchmark_runs_both_sides_and_their_losses_agree(tmp_path: Path) -> None:
    figures = tmp_path / "figures.json"
    command = [sys.executable, "-m", "benchmarks.sft", "--nproc", "1", "--repeats", "1", "--steps", "4"]
    command += ["--work", str(tmp_path / "work"), "--json", str(figures)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "tokens_per_s ratio (posttrain/trl):" in result.stdout
    assert "peak_gpu_mb" not in result.stdout  # not measured on CPU, so not in the table
    runs = json.loads(figures.read_text())["1"]
    (ours,), (theirs,) = runs["posttrain"], runs["trl"]
    for run in (ours, theirs):
        assert run["tokens_per_s"] > 0 and run["first_step_s"] > run["worker_start_s"] > 0
    assert sorted(ours["values"]) == sorted(theirs["values"]) == ["1", "2", "3", "4"]
    for step, loss in theirs["values"].items():
        assert ours["values"][step] == pytest.approx(loss, rel=1e-4), step
    assert ours["values"]["4"] < ours["values"]["1"]
