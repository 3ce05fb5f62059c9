"""benchmarks/gpu_lease.sh's plan, on any machine: the pending GPU proofs, in order of value, within the budget of
a lent GPU's window; names it does not know refused before anything is installed."""

import re
import subprocess

from helpers import REPO

BUDGET_S = 480


def plan(*cases: str) -> subprocess.CompletedProcess:
    command = ["bash", "benchmarks/gpu_lease.sh", "--plan", *cases]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)


def test_the_plan_runs_the_pending_proofs_in_order_within_the_budget() -> None:
    result = plan()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    cases = [line.split(":")[0] for line in lines[:-1]]
    assert cases == ["rollout", "grpo", "rloo", "template", "lora-1.5b", "qlora-1.5b", "e2e"]
    planned = [int(re.search(r": (\d+) s", line).group(1)) for line in lines[:-1] if "skipped" not in line]
    assert sum(planned) <= BUDGET_S and cases[0] == "rollout"
    assert lines[-1] == f"planned: {sum(planned)} s of {BUDGET_S} s (GPU_BUDGET_S), on an H100"
    # what does not fit is named for a second call
    assert "rloo: 240 s, skipped: over the budget (run it in a second call)" in lines


def test_named_cases_are_planned_and_an_unknown_one_is_refused() -> None:
    assert plan("e2e", "grpo").stdout.splitlines() == [
        "e2e: 90 s",
        "grpo: 240 s",
        "planned: 330 s of 480 s (GPU_BUDGET_S), on an H100",
    ]
    refused = plan("grpo", "nope")
    assert refused.returncode == 2 and not refused.stdout and refused.stderr.startswith("unknown case nope (known: ")
