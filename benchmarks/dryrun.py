"""What ``torchx run --dryrun`` of each component costs over ``python -c "import torchx.specs"``.

    python -m benchmarks.dryrun [--repeats 7]

Each component's tiny template, dry-run through the real ``torchx`` CLI (one
process each time, started from this checkout), alternated with the baseline
run by run; medians of the wall time and the overhead (component minus
baseline). The target: at most 1 s over the baseline, for every component.
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from benchmarks.harness import PYTHON_BIN, REPO, run_env
from posttrain.components.spec.registry import SPEC_CLASSES

BASELINE = [sys.executable, "-c", "import torchx.specs"]


def seconds(command: List[str], env: Dict[str, str]) -> float:
    """Wall time of one run of ``command``, which must succeed."""
    started = time.perf_counter()
    subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dryrun", description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    options = parser.parse_args(argv)
    env = run_env(Path(tempfile.mkdtemp(prefix="bench-dryrun-")), gpus=0)
    print("| component | dryrun (s) | import torchx.specs (s) | overhead (s) |\n| --- | ---: | ---: | ---: |")
    worst = 0.0
    for algorithm in SPEC_CLASSES:
        dryrun = [
            str(PYTHON_BIN / "torchx"),
            "run",
            "--dryrun",
            "-s",
            "local_cwd",
            f"posttrain.{algorithm}",
            "--spec",
            f"templates/{algorithm}/tiny.yaml",
        ]
        # warm the page cache and the bytecode
        seconds(dryrun, env), seconds(BASELINE, env)
        runs = [(seconds(dryrun, env), seconds(BASELINE, env)) for _ in range(options.repeats)]
        ours, base = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        worst = max(worst, ours - base)
        print(f"| posttrain.{algorithm} | {ours:.3f} | {base:.3f} | {ours - base:.3f} |", flush=True)
    print(f"dryrun overhead over import torchx.specs, worst component: {worst:.2f} s")


if __name__ == "__main__":
    main()
