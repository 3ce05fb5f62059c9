"""Side by side: posttrain's run of a spec against the plain TRL script, interleaved A B A B.

Each run is a fresh process tree with a fresh output directory and a fresh
``HF_HOME`` (every run tokenises its data, as a first launch does). From each
run:

- ``tokens_per_s``: non-padding training tokens (the trainer's own
  ``num_input_tokens_seen``, all ranks; GRPO's own ``num_tokens``: prompts and
  completions) per second of wall time between the first and the last logged
  step: training speed, start-up excluded;
- ``first_step_s``: seconds from launching the command to the first
  optimizer step's log line, in two parts: ``worker_start_s``, launch to the
  start of the first training process (the launcher's share: torchx's CLI,
  torchrun, the rendezvous), and ``worker_to_first_step_s``, the rest (the
  job's own start-up: imports, data, model, the first step);
- ``peak_rss_mb``: the largest resident set of any process of the run
  (``wait4``'s ``ru_maxrss`` over the whole process tree);
- ``peak_gpu_mb`` (GPU runs): the most GPU memory in use, all GPUs together,
  as ``nvidia-smi`` reports it twice a second (the allocator's cache
  included: what the run holds, not what its tensors need);
- ``loop_tokens_per_s`` (generating trainers): the same tokens over the same
  window less the seconds spent generating completions, which TRL times on
  both sides alike (``benchmarks/timing_hook``): the training loop's speed;
- the loss at every logged step (GRPO: the reward, its loss says little).

Medians over the repeats per side; the ratio is posttrain / plain TRL.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from math import nan
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import yaml

REPO = Path(__file__).resolve().parent.parent
PYTHON_BIN = Path(sys.executable).parent
SECONDS = ("first_step_s", "worker_start_s", "worker_to_first_step_s")
FIGURES = ("tokens_per_s", "loop_tokens_per_s", *SECONDS, "peak_rss_mb", "peak_gpu_mb")
TIMING_HOOK = REPO / "benchmarks" / "timing_hook"


@dataclass
class Run:
    tokens_per_s: float
    # nan where nothing generates
    loop_tokens_per_s: float
    first_step_s: float
    worker_start_s: float
    peak_rss_mb: float
    # nan on CPU
    peak_gpu_mb: float
    # the logged value compared at each step: loss, or reward
    per_step: str
    # per_step at each logged step
    values: Dict[int, float]

    @property
    def worker_to_first_step_s(self) -> float:
        return self.first_step_s - self.worker_start_s

    @property
    def final(self) -> float:
        """Mean of the last 5 logged values (single steps are noisy)."""
        last = [self.values[step] for step in sorted(self.values)[-5:]]
        return sum(last) / len(last)


@dataclass
class Case:
    """One comparison: the algorithm, model, data, shared settings and the number of processes."""

    algorithm: str
    model: Path
    data: Path
    training: Dict
    nproc: int = 1
    gpus: int = 0
    posttrain_overrides: Sequence[str] = ()
    # settings only the plain script needs (use_cpu, ...)
    plain_training: Dict = field(default_factory=dict)
    # posttrain's rewards section (the plain script names the same function)
    rewards: Sequence[Dict] = ()
    per_step: str = "loss"
    # the logged running count of tokens trained
    tokens: str = "num_input_tokens_seen"
    # a template the posttrain side runs as shipped, given only the workload and MEASURING's settings
    template: Optional[Path] = None


# what a benchmarked template takes of the benchmark's training settings: how long it runs and what it logs (its
# saving stays: a template saves every save_steps, past the benchmark's length)
MEASURING = ("max_steps", "logging_steps", "seed", "report_to")


def run_env(work: Path, gpus: int) -> Dict[str, str]:
    """The environment of every benchmarked command: offline, its own ``HF_HOME`` under ``work``, GPUs or none."""
    env = dict(os.environ, HF_HOME=str(work / "hf_home"), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["BENCH_PROFILE"] = str(work / "profile.jsonl")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TIMING_HOOK), env.get("PYTHONPATH")]))
    env["PATH"] = f"{PYTHON_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("TORCHX_CONTEXT_NAME", None)
    # posttrain as installed, with its bytecode cached: pip compiles it at install, an editable install at first
    # import, unless this shell's variable forbids it (then every process compiles it again; site-packages has it)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if gpus == 0:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def posttrain_spec(case: Case, work: Path) -> Dict:
    """The benchmark's spec, or ``case.template`` with the workload's model and data and MEASURING's settings."""
    if case.template is None:
        spec = {"algorithm": case.algorithm, "model": {}, "training": dict(case.training)}
    else:
        spec = yaml.safe_load(case.template.read_text())
        spec["training"].update({key: value for key, value in case.training.items() if key in MEASURING})
    spec["model"]["name_or_path"] = str(case.model)
    spec.setdefault("data", {})["train"] = {"path": str(case.data)}
    spec["training"]["output_dir"] = str(work / "output")
    if case.rewards:
        spec["rewards"] = list(case.rewards)
    return spec


def posttrain_command(case: Case, work: Path, port: int) -> List[str]:
    spec_path = work / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(posttrain_spec(case, work)))
    gpu = ["--gpu", str(case.gpus)] if case.gpus else []
    return [
        str(PYTHON_BIN / "torchx"),
        "run",
        "-s",
        "local_cwd",
        f"posttrain.{case.algorithm}",
        "--spec",
        str(spec_path),
        "-j",
        f"1x{case.nproc}",
        "--rdzv_port",
        str(port),
        *gpu,
        *case.posttrain_overrides,
    ]


def plain_command(case: Case, work: Path, port: int) -> List[str]:
    settings = {
        "algorithm": case.algorithm,
        "model": str(case.model),
        "data": str(case.data),
        "metrics": str(work / "output" / "metrics.jsonl"),
        "training": {**case.training, **case.plain_training, "output_dir": str(work / "output")},
    }
    (work / "output").mkdir(parents=True)
    settings_path = work / "settings.json"
    settings_path.write_text(json.dumps(settings))
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(case.nproc),
        "--master_port",
        str(port),
        str(REPO / "benchmarks" / "plain_trl.py"),
        str(settings_path),
    ]


def _stat(pid: int) -> List[str]:
    """The fields of ``/proc/PID/stat`` after the command name: [1] the parent, [19] the start in ticks since boot."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _is_launcher(argv: List[bytes]) -> bool:
    """torchrun, bare (the plain TRL script's) or in posttrain's launcher."""
    return any(name in argv for name in (b"torch.distributed.run", b"posttrain.entrypoints.launcher"))


def _descends_from(pid: int, root: int, processes: Dict[int, tuple]) -> bool:
    """Whether ``pid`` is in ``root``'s tree (another run's torchrun on the machine is not)."""
    while pid in processes and pid != root:
        pid = processes[pid][0]
    return pid == root


def _watch_worker_start(root: int, finished: threading.Event, delays: List[float]) -> None:
    """Appends how long after ``root`` started the first training process (a Python child of torchrun) started."""
    try:
        root_ticks = int(_stat(root)[19])
    except OSError:
        # already gone
        return
    while not finished.is_set():
        # pid: (parent, start ticks, argv)
        processes = {}
        for entry in Path("/proc").iterdir():
            try:
                fields, argv = _stat(int(entry.name)), (entry / "cmdline").read_bytes().split(b"\0")
                processes[int(entry.name)] = (int(fields[1]), int(fields[19]), argv)
            except (OSError, ValueError):
                continue
        starts = [
            start
            for pid, (parent, start, argv) in processes.items()
            if b"python" in argv[0]
            and _is_launcher(processes.get(parent, (0, 0, []))[2])
            and _descends_from(pid, root, processes)
        ]
        if starts:
            delays.append((min(starts) - root_ticks) / os.sysconf("SC_CLK_TCK"))
            return
        finished.wait(0.05)


def _watch_gpu_memory(finished: threading.Event, peaks: List[float]) -> None:
    """Appends the GPUs' memory in use, summed, every half second until ``finished``."""
    query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    while not finished.wait(0.5):
        try:
            used = subprocess.run(query, capture_output=True, text=True, check=False).stdout.split()
        except FileNotFoundError:
            # no nvidia-smi: the figure stays nan
            return
        peaks.append(sum(float(mb) for mb in used))


def measure(
    command: List[str], work: Path, gpus: int, per_step: str = "loss", tokens: str = "num_input_tokens_seen"
) -> Run:
    """Runs ``command`` to the end; its figures from ``work/output/metrics.jsonl``, ``/proc`` and the tree's rusage."""
    log_path = work / "run.log"
    finished, worker_starts, gpu_memory = threading.Event(), [], []
    if gpus:
        threading.Thread(target=_watch_gpu_memory, args=(finished, gpu_memory), daemon=True).start()
    started = time.time()
    with log_path.open("w") as log:
        process = subprocess.Popen(command, cwd=REPO, env=run_env(work, gpus), stdout=log, stderr=subprocess.STDOUT)
        threading.Thread(target=_watch_worker_start, args=(process.pid, finished, worker_starts), daemon=True).start()
        _, status, usage = os.wait4(process.pid, 0)
    finished.set()
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        tail = log_path.read_text()[-4000:]
        raise RuntimeError(f"{' '.join(command[:6])} ... exited {process.returncode}; log {log_path}:\n{tail}")
    records = [json.loads(line) for line in (work / "output" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if tokens in r and "time" in r]
    if len(steps) < 3:
        raise RuntimeError(f"{work}: fewer than 3 logged steps with {tokens} and time")
    trained = steps[-1][tokens] - steps[0][tokens]
    start, end = steps[0]["time"], steps[-1]["time"]
    generating = _generation_s(work, start, end)
    return Run(
        tokens_per_s=trained / (end - start),
        loop_tokens_per_s=trained / (end - start - generating) if generating else nan,
        first_step_s=steps[0]["time"] - started,
        worker_start_s=worker_starts[0] if worker_starts else nan,
        peak_rss_mb=usage.ru_maxrss / 1024,
        peak_gpu_mb=max(gpu_memory, default=nan),
        per_step=per_step,
        values={r["step"]: r[per_step] for r in records if per_step in r},
    )


def _generation_s(work: Path, start: float, end: float) -> float:
    """Seconds spent generating completions that ended between ``start`` and ``end`` (TRL's own sections)."""
    profile = work / "profile.jsonl"
    sections = [json.loads(line) for line in profile.read_text().splitlines()] if profile.exists() else []
    return sum(s["seconds"] for s in sections if ".generate" in s["name"] and start < s["end"] <= end)


SIDES: Dict[str, Callable[[Case, Path, int], List[str]]] = {"posttrain": posttrain_command, "trl": plain_command}


def compare(
    case: Case, repeats: int, keep: Optional[Path] = None, sides: Sequence[str] = tuple(SIDES)
) -> Dict[str, List[Run]]:
    """Runs each side ``repeats`` times, interleaved (posttrain, trl, posttrain, trl, ...)."""
    runs: Dict[str, List[Run]] = {side: [] for side in sides}
    root = Path(tempfile.mkdtemp(prefix=f"bench-{case.algorithm}-"))
    try:
        for repeat in range(repeats):
            for side in sides:
                command = SIDES[side]
                work = root / f"{side}-{repeat}"
                work.mkdir()
                run = measure(command(case, work, 29400 + repeat), work, case.gpus, case.per_step, case.tokens)
                runs[side].append(run)
                loop = (
                    ""
                    if run.loop_tokens_per_s != run.loop_tokens_per_s
                    else f" ({run.loop_tokens_per_s:.0f} in the loop)"
                )
                gpu = "" if run.peak_gpu_mb != run.peak_gpu_mb else f", peak GPU {run.peak_gpu_mb:.0f} MB"
                first = run.values[min(run.values)]
                print(
                    f"  {side:9} run {repeat + 1}/{repeats}: {run.tokens_per_s:8.0f} tokens/s{loop}, first step "
                    f"{run.first_step_s:5.1f} s (worker started at {run.worker_start_s:.2f} s), "
                    f"peak RSS {run.peak_rss_mb:6.0f} MB{gpu}, {run.per_step} {first:.4f} first, {run.final:.4f} final",
                    flush=True,
                )
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
        else:
            shutil.copytree(root, keep, dirs_exist_ok=True)
    return runs


def medians(runs: List[Run]) -> Dict[str, float]:
    figures = {name: statistics.median(getattr(run, name) for run in runs) for name in FIGURES}
    figures[f"final_{runs[0].per_step}"] = statistics.median(run.final for run in runs)
    return figures


def table(title: str, runs: Dict[str, List[Run]]) -> str:
    """A markdown table of the medians and the ratio posttrain / trl."""
    ours, theirs = medians(runs["posttrain"]), medians(runs["trl"])
    lines = [
        f"**{title}** (medians of {len(runs['trl'])} interleaved runs each)",
        "",
        "| figure | posttrain | plain TRL | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name in ours:
        # nan on both sides: not measured (CPU)
        if ours[name] != ours[name] and theirs[name] != theirs[name]:
            continue
        digits = 2 if name in SECONDS else 1 if name in FIGURES else 4
        lines.append(
            f"| {name} | {ours[name]:.{digits}f} | {theirs[name]:.{digits}f} | {ours[name] / theirs[name]:.2f} |"
        )
    return "\n".join(lines)


def step_table(runs: Dict[str, List[Run]]) -> str:
    """The compared value (loss, or reward) at each logged step, first run of each side."""
    ours, theirs, name = runs["posttrain"][0].values, runs["trl"][0].values, runs["trl"][0].per_step
    lines = [f"| step | posttrain {name} | plain TRL {name} |", "| ---: | ---: | ---: |"]
    lines += [
        f"| {step} | {ours.get(step, float('nan')):.4f} | {theirs.get(step, float('nan')):.4f} |"
        for step in sorted(set(ours) | set(theirs))
    ]
    return "\n".join(lines)


def ratio(runs: Dict[str, List[Run]], figure: str = "tokens_per_s") -> float:
    return medians(runs["posttrain"])[figure] / medians(runs["trl"])[figure]
