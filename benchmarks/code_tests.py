"""The ``code_tests`` reward's cost (``components/spec/code_runs.py``): seconds per scored completion, 64
completions of a small function (half right, half wrong) with MBPP-style tests, as a GRPO step scores them: one
batch, this process's share of the CPUs (``code_runs.workers()``) at once. Each completion is two sandboxed
Python processes, so this is mostly their start-up.

    python -m benchmarks.code_tests [--completions 64] [--repeats 5]
"""

import argparse
import statistics
import time

from posttrain.components.spec import code_runs
from posttrain.components.spec.rewards import builtin_reward

RIGHT = "```python\ndef add(a, b):\n    return a + b\n```"
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"
TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(0, 0) == 0\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completions", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    reward = builtin_reward("code_tests", {})
    completions = [RIGHT, WRONG] * (args.completions // 2)
    tests = [TESTS] * len(completions)
    print(f"bounds held: {', '.join(sorted(code_runs.isolation())) or 'none'}; {code_runs.workers()} at once")
    seconds = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        scores = reward(completions, tests=tests)
        seconds.append(time.perf_counter() - started)
        assert scores == [1.0, 0.0] * (len(completions) // 2), scores
    per = [s / len(completions) * 1000 for s in seconds]
    print(
        f"{len(completions)} completions: median {statistics.median(per):.1f} ms per completion (min {min(per):.1f}, "
        f"max {max(per):.1f}; {args.repeats} runs)"
    )


if __name__ == "__main__":
    main()
