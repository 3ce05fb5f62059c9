"""The command line shared by ``python -m benchmarks.sft``, ``benchmarks.dpo`` and ``benchmarks.grpo``."""

import argparse
import json
import tempfile
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Sequence

from benchmarks import harness, workload

# H100/H200 dense bf16 peak, for MFU
PEAK_TFLOPS = 989.0


def main(
    algorithm: str,
    rows: Callable[..., Iterator[Dict]],
    n_rows: int,
    argv: Optional[Sequence[str]] = None,
    training: Optional[Dict] = None,
    gpu_training: Optional[Dict] = None,
    rewards: Sequence[Dict] = (),
    per_step: str = "loss",
    tokens: str = "num_input_tokens_seen",
) -> None:
    """Parses the command line, builds the workload, runs both sides and prints the tables.

    ``training``: the algorithm's own settings beside the shared ones (``gpu_training`` in their place under
    ``--gpu``: the shape a GPU trains at); ``rewards``: posttrain's
    rewards section; ``per_step``: the logged value compared at every step; ``tokens``: the logged running count
    of tokens trained.
    """
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{algorithm}", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one process, 2 repeats (under 10 minutes on 2 cores)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2], help="processes per run, one case each")
    parser.add_argument("--gpu", action="store_true", help="a 0.5B model on the GPUs (one process per GPU), with MFU")
    parser.add_argument("--model", choices=sorted(workload.GPU_SHAPES), default="0.5b", help="the shape on GPUs")
    parser.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS, help="per-GPU peak, for MFU")
    parser.add_argument("--override", nargs="*", default=[], help="posttrain spec overrides, key.path=value")
    parser.add_argument(
        "--template",
        type=Path,
        help="posttrain runs this template as shipped, given only the workload's model and data and the run's "
        f"length and logging ({', '.join(harness.MEASURING)})",
    )
    parser.add_argument("--plain", nargs="*", default=[], help="plain TRL settings, key=value (YAML values)")
    parser.add_argument("--work", type=Path, help="where the model and data go (default: a temp dir)")
    parser.add_argument("--keep", type=Path, help="copy every run's directory here")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    parser.add_argument(
        "--sides", nargs="+", choices=sorted(harness.SIDES), default=list(harness.SIDES), help="run only these"
    )
    options = parser.parse_args(argv)
    if options.quick:
        options.repeats, options.nproc = 2, [1]

    import yaml

    work = options.work or Path(tempfile.mkdtemp(prefix="bench-workload-"))
    gpu_shape = options.model if options.gpu else None
    model = workload.build_model_dir(work / (f"model-{gpu_shape}" if options.gpu else "model"), gpu_shape)
    data = workload.write_rows(work / f"{algorithm}.jsonl", rows(n_rows, seed=0, scale=4 if options.gpu else 1))
    params = workload.parameter_count(model)
    training = {
        "max_steps": options.steps,
        "learning_rate": 1e-3,
        "logging_steps": 1,
        "seed": 0,
        "save_strategy": "no",
        "report_to": "none",
        "bf16": options.gpu,
        **((gpu_training if options.gpu and gpu_training is not None else training) or {}),
    }
    # on GPUs each side takes its own default: TRL's 8 rows, posttrain's gpu_batch
    if not options.gpu:
        training.setdefault("per_device_train_batch_size", 8)
    plain_training = {"include_num_input_tokens_seen": "non_padding", "use_cpu": not options.gpu}
    plain_training.update({k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in options.plain)})
    device = "GPU" if options.gpu else "CPU"
    print(
        f"{algorithm}: model {params / 1e6:.1f}M parameters, {n_rows} rows ({data}), {options.steps} steps, "
        f"batch {training.get('per_device_train_batch_size', 'by default')} per process, {device}",
        flush=True,
    )

    results = {}
    for nproc in options.nproc:
        case = harness.Case(
            algorithm,
            model,
            data,
            training,
            nproc=nproc,
            gpus=nproc if options.gpu else 0,
            posttrain_overrides=options.override,
            plain_training=plain_training,
            rewards=rewards,
            per_step=per_step,
            tokens=tokens,
            template=options.template and options.template.resolve(),
        )
        print(f"{device}, {nproc} process(es):", flush=True)
        keep = options.keep / f"{nproc}proc" if options.keep else None
        runs = harness.compare(case, options.repeats, keep=keep, sides=options.sides)
        results[nproc] = runs
        if len(runs) == len(harness.SIDES):
            print(harness.table(f"{algorithm}, {device}, -j 1x{nproc}", runs))
        if options.gpu:
            for side, side_runs in runs.items():
                figures, peak = harness.medians(side_runs), nproc * options.peak_tflops * 1e12
                loop = figures["loop_tokens_per_s"]
                in_loop = "" if loop != loop else f", training loop {100 * 6 * params * loop / peak:.1f}%"
                print(f"MFU {side}: {100 * 6 * params * figures['tokens_per_s'] / peak:.1f}%{in_loop}")
        print()
    if options.json:
        options.json.write_text(
            json.dumps(
                {
                    n: {side: [vars(run) for run in side_runs] for side, side_runs in runs.items()}
                    for n, runs in results.items()
                },
                indent=1,
            )
        )
    if len(options.sides) < len(harness.SIDES):
        return
    first = results[options.nproc[0]]
    print(harness.step_table(first))
    for nproc, runs in results.items():
        suffix = "" if len(results) == 1 else f" [-j 1x{nproc}]"
        print(f"tokens_per_s ratio (posttrain/trl): {harness.ratio(runs):.2f}{suffix}")
