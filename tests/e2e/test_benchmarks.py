"""The SFT and GRPO benchmarks, end to end on CPU: the commands a lent GPU runs first (``benchmarks/gpu_lease.sh``)
work here.

A small configuration of ``python -m benchmarks.sft`` and ``benchmarks.grpo``:
both sides train (posttrain through ``torchx run``, the plain TRL script
through torchrun), the figures come back, and the losses (GRPO: the rewards)
agree step by step. ``benchmarks.rloo`` is GRPO's harness with RLOO's trainer;
RLOO against plain TRL is ``test_fidelity.py``'s.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("algorithm", ["sft", "grpo"])
def test_the_benchmark_runs_both_sides_and_they_agree_step_by_step(tmp_path: Path, algorithm: str) -> None:
    figures = tmp_path / "figures.json"
    # three logged steps: the fewest the figures are taken from
    command = [sys.executable, "-m", f"benchmarks.{algorithm}", "--nproc", "1", "--repeats", "1", "--steps", "3"]
    command += ["--work", str(tmp_path / "work"), "--json", str(figures)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "tokens_per_s ratio (posttrain/trl):" in result.stdout
    # not measured on CPU, so not in the table
    assert "peak_gpu_mb" not in result.stdout
    runs = json.loads(figures.read_text())["1"]
    (ours,), (theirs,) = runs["posttrain"], runs["trl"]
    for run in (ours, theirs):
        assert run["tokens_per_s"] > 0 and run["first_step_s"] > run["worker_start_s"] > 0
        # generation timed apart: the training loop alone is faster
        if algorithm != "sft":
            assert run["loop_tokens_per_s"] > run["tokens_per_s"]
            assert "| loop_tokens_per_s |" in result.stdout
        else:
            # nan: nothing generates
            assert run["loop_tokens_per_s"] != run["loop_tokens_per_s"]
    assert sorted(ours["values"]) == sorted(theirs["values"]) == ["1", "2", "3"]
    for step, value in theirs["values"].items():
        assert ours["values"][step] == pytest.approx(value, rel=1e-4), step
    if algorithm == "sft":
        assert ours["values"]["3"] < ours["values"]["1"]
