"""vLLM's engine on CPU, eager against torch.compile: what ``vllm_generation.runs_eagerly`` decides on.

``python -m benchmarks.vllm_engine`` (in the vLLM environment, docs/pages/vllm.md) starts vLLM's ``LLM`` on the
benchmarks' CPU model (``workload.py``: 5.1M parameters, head size 32) with ``enforce_eager`` on and off,
interleaved (eager, compiled, eager, ...), each in a process of its own with a fresh compile cache. Per run:

- ``start_s``: the engine's construction (``LLM(...)``: model load, torch.compile where on, KV cache, warm-up);
- ``tokens_per_s_1x8`` and ``tokens_per_s_8x8``: completion tokens per second of ``generate`` after one warm-up
  call, three calls of 1 prompt x 8 completions (what a process of the tiny GRPO templates asks) and of 8 x 8, 128
  tokens each (``ignore_eos``).

Medians per mode, and each figure's ratio compiled / eager.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from benchmarks import workload

MODES = ("eager", "compiled")


def measure(model: str, eager: bool) -> Dict[str, float]:
    """One engine's start-up and generation speed (run in a process of its own: vLLM keeps state per process)."""
    from vllm import LLM, SamplingParams

    started = time.monotonic()
    llm = LLM(model=model, dtype="float32", gpu_memory_utilization=0.15, max_model_len=512, seed=0, enforce_eager=eager)
    start_s = time.monotonic() - started
    params = SamplingParams(n=8, max_tokens=128, temperature=1.0, ignore_eos=True, seed=0)
    figures = {"start_s": start_s}
    for count in (1, 8):
        prompts = [{"prompt_token_ids": list(range(10 + i, 40 + i))} for i in range(count)]
        llm.generate(prompts, params, use_tqdm=False)
        started, tokens = time.monotonic(), 0
        for _ in range(3):
            outputs = llm.generate(prompts, params, use_tqdm=False)
            tokens += sum(len(completion.token_ids) for output in outputs for completion in output.outputs)
        figures[f"tokens_per_s_{count}x8"] = tokens / (time.monotonic() - started)
    return figures


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vllm_engine", description=__doc__)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--run", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.run:
        print("FIGURES " + json.dumps(measure(options.model, eager=options.run == "eager")), flush=True)
        return
    root = Path(tempfile.mkdtemp(prefix="bench-vllm-engine-"))
    model = str(workload.build_model_dir(root / "model"))
    runs: Dict[str, List[Dict[str, float]]] = {mode: [] for mode in MODES}
    print(f"vLLM's engine on {model}, {os.cpu_count()} CPUs", flush=True)
    for repeat in range(options.repeats):
        for mode in MODES:
            # a compile cache of its own: each compiled start pays what a first start pays
            env = {**os.environ, "VLLM_CACHE_ROOT": str(root / f"cache-{mode}-{repeat}")}
            command = [sys.executable, "-m", "benchmarks.vllm_engine", "--run", mode, "--model", model]
            result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            line = next(line for line in result.stdout.splitlines() if line.startswith("FIGURES "))
            runs[mode].append(json.loads(line.removeprefix("FIGURES ")))
            print(f"{mode} {repeat}: {runs[mode][-1]}", flush=True)
    medians = {
        mode: {key: statistics.median(run[key] for run in runs[mode]) for key in runs[mode][0]} for mode in MODES
    }
    print("| mode | engine start-up (s) | tokens/s, 1 x 8 | tokens/s, 8 x 8 |\n| --- | ---: | ---: | ---: |")
    for mode, figures in medians.items():
        print(
            f"| {mode} | {figures['start_s']:.1f} | {figures['tokens_per_s_1x8']:,.0f} | {figures['tokens_per_s_8x8']:,.0f} |"
        )
    ratios = {key: medians["compiled"][key] / medians["eager"][key] for key in medians["eager"]}
    print("compiled / eager: " + ", ".join(f"{key} {ratio:.2f}x" for key, ratio in ratios.items()))


if __name__ == "__main__":
    main()
