"""GRPO with transformers' ``generate``, vLLM colocated, and vLLM as the job's ``vllm`` server role, in lockstep
and generating ahead of training.

``python -m benchmarks.grpo_generation`` (in the vLLM environment, docs/pages/vllm.md) runs
``torchx run -s local_cwd posttrain.grpo`` of ``templates/grpo/tiny-vllm-server.yaml`` four ways,
interleaved (generate, colocate, server, async, generate, ...), each with a fresh output directory and ``HF_HOME``,
on the benchmarks' CPU model (``workload.py``: 5.1M parameters, head size 32 as vLLM's CPU attention needs)
with 128-token completions; ``--tiny`` keeps the template's 0.1M model and 16 tokens. Per run:

- ``steps_per_s``: logged steps after the first, over the wall time since the first (start-up excluded);
- ``first_step_s``: launch to the first optimizer step (vLLM's start-up included);
- ``gen_tokens_per_s``: run_summary.json's generation tokens/s (vLLM only: the time in its generate);
- ``trainer_wait_s``: the trainers' wait for the role per step, the push of the weights included (the role only:
  ``generation/trainer_wait_s``, the push and the generation in lockstep; with ``generation.max_lag: 1`` the
  samples not ready yet, plus ``generation/weight_sync_s``, the push);
- ``reward``: the mean of the last three logged rewards.

Medians per mode, and each mode's steps/s over ``generate``'s.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from benchmarks import workload
from benchmarks.harness import PYTHON_BIN, REPO, run_env

TEMPLATE = "templates/grpo/tiny-vllm-server.yaml"
# each mode sets only what it reads (the spec refuses options that do nothing; ~ removes the template's)
VLLM_OPTIONS = ["~training.vllm_mode", "~training.vllm_gpu_memory_utilization", "~training.vllm_max_model_length"]
MODES: Dict[str, List[str]] = {
    "generate": ["training.use_vllm=false", *VLLM_OPTIONS],
    "colocate": ["training.vllm_mode=colocate"],
    "server": ["training.vllm_mode=server", "training.vllm_server_port={server_port}"],
    "async": ["training.vllm_mode=server", "training.vllm_server_port={server_port}", "generation.max_lag=1"],
}
FIGURES = ("steps_per_s", "first_step_s", "gen_tokens_per_s", "trainer_wait_s", "reward")


def run(mode: str, work: Path, nproc: int, port: int, overrides: List[str]) -> Dict[str, float]:
    output = work / "output"
    command = [
        str(PYTHON_BIN / "torchx"),
        "run",
        "-s",
        "local_cwd",
        "posttrain.grpo",
        "--spec",
        TEMPLATE,
        "-j",
        f"1x{nproc}",
        "--rdzv_port",
        str(port),
        f"training.output_dir={output}",
        *overrides,
        *(override.format(server_port=port + 1) for override in MODES[mode]),
    ]
    started = time.time()
    with (work / "run.log").open("w") as log:
        result = subprocess.run(command, cwd=REPO, env=run_env(work, gpus=0), stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise RuntimeError(f"{mode}: exit {result.returncode}; log {work / 'run.log'}")
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if "reward" in r and "time" in r]
    generation = json.loads((output / "run_summary.json").read_text())["generation"]
    return {
        "steps_per_s": (logged[-1]["step"] - logged[0]["step"]) / (logged[-1]["time"] - logged[0]["time"]),
        "first_step_s": logged[0]["time"] - started,
        "gen_tokens_per_s": generation.get("tokens_per_s") or float("nan"),
        "trainer_wait_s": statistics.mean(
            r.get("generation/trainer_wait_s", float("nan")) + r.get("generation/weight_sync_s", 0.0)
            for r in logged[1:]
        ),
        "reward": statistics.mean(r["reward"] for r in logged[-3:]),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grpo_generation", description=__doc__)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--nproc", type=int, default=2, help="trainer processes (-j 1xN)")
    parser.add_argument("--tiny", action="store_true", help="the template's 0.1M model and 16-token completions")
    parser.add_argument("--keep", type=Path, help="copy every run's directory here")
    options = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-grpo-generation-"))
    # the batch BENCHMARKS.md's tables were measured with: 2 prompts x 8 completions a step on 2 processes
    overrides = [f"training.max_steps={options.steps}", "training.per_device_train_batch_size=8"]
    if not options.tiny:
        model = workload.build_model_dir(root / "model")
        overrides += [
            f"model.name_or_path={model}",
            "training.max_completion_length=128",
            "training.learning_rate=1e-4",
        ]
    runs: Dict[str, List[Dict[str, float]]] = {mode: [] for mode in MODES}
    print(f"GRPO {TEMPLATE} {' '.join(overrides)}, -j 1x{options.nproc}, {os.cpu_count()} CPUs", flush=True)
    try:
        for repeat in range(options.repeats):
            for index, mode in enumerate(MODES):
                work = root / f"{mode}-{repeat}"
                work.mkdir()
                figures = run(mode, work, options.nproc, 29600 + 10 * index + 3 * repeat, overrides)
                runs[mode].append(figures)
                print(
                    f"  {mode:8} run {repeat + 1}/{options.repeats}: "
                    + ", ".join(f"{name} {figures[name]:.2f}" for name in FIGURES),
                    flush=True,
                )
    finally:
        if options.keep is not None:
            shutil.copytree(root, options.keep, dirs_exist_ok=True)
        shutil.rmtree(root, ignore_errors=True)
    medians = {
        mode: {name: statistics.median(r[name] for r in mode_runs) for name in FIGURES}
        for mode, mode_runs in runs.items()
    }
    model = "the template's 0.1M model, 16 tokens" if options.tiny else "5.1M model, 128 tokens"
    print(f"\n**GRPO generation, CPU, -j 1x{options.nproc}, {model}** (medians of {options.repeats} runs each)\n")
    print(
        "| mode | steps/s | vs generate | launch to first step (s) | generation tokens/s | trainers' wait per step (s) "
        "| final reward |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    base = medians["generate"]["steps_per_s"]
    for mode, figures in medians.items():
        print(
            f"| {mode} | {figures['steps_per_s']:.3f} | {figures['steps_per_s'] / base:.2f} | "
            f"{figures['first_step_s']:.1f} | {figures['gen_tokens_per_s']:.0f} | {figures['trainer_wait_s']:.3f} | "
            f"{figures['reward']:.2f} |"
        )


if __name__ == "__main__":
    main()
