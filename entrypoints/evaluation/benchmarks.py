"""Standard benchmarks through EleutherAI's lm-evaluation-harness (``lm-eval``; ``pip install
'posttrain[lm-eval]'``): each model's tasks run by the harness's own definitions (or the user's, from
``include_path``), their metrics in the evaluation's summary.

Rank 0 runs them, one model at a time, on its device: the harness splits work
across processes only on several GPUs under its own launcher, and its results
do not depend on how many processes there are. The other ranks wait
(:func:`posttrain.entrypoints.process.distributed.waiting_group`).
"""

import difflib
import hashlib
import re
from pathlib import Path
from typing import Any, Dict, Optional

from posttrain.components.spec.judging import BenchmarksSpec
from posttrain.components.spec.messages import SpecError

INSTALL = "pip install 'posttrain[lm-eval]'"
# a task's metrics: name -> value and standard error (None where the harness computes none)
TaskResults = Dict[str, Dict[str, Optional[float]]]


def task_manager(benchmarks: BenchmarksSpec) -> Any:
    """The harness's index of tasks (its own and ``include_path``'s), each task named checked; one line for the
    harness missing, a folder missing or an unknown task (with the nearest name)."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise SpecError(
            [f"benchmarks: needs lm-evaluation-harness, which the job's environment lacks: {INSTALL}"]
        ) from None
    include = benchmarks.include_path
    if include is not None and not Path(include).is_dir():
        raise SpecError([f"benchmarks.include_path: no folder {include} (relative paths start at {Path.cwd()})"])
    manager = TaskManager(include_path=include)
    known = manager.all_tasks
    problems = []
    for index, task in enumerate(benchmarks.tasks):
        if task not in known:
            close = difflib.get_close_matches(task, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            where = " (nor in include_path)" if include is not None else ""
            problems.append(f"benchmarks.tasks.{index}: lm-evaluation-harness has no task {task!r}{where}{hint}")
    if problems:
        raise SpecError(problems)
    return manager


def tasks_fingerprint(benchmarks: BenchmarksSpec) -> Optional[str]:
    """What identifies the user's own task definitions (every file under ``include_path``), so that results of
    an edited task are not taken for this evaluation's; None without them."""
    if benchmarks.include_path is None:
        return None
    digest = hashlib.sha256()
    root = Path(benchmarks.include_path)
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def run(model: Any, tokenizer: Any, benchmarks: BenchmarksSpec, manager: Any, seed: int) -> Dict[str, TaskResults]:
    """Each task's (and group's) metrics of ``model``, as the harness computes them, seeded by ``seed``."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=benchmarks.batch_size, device=str(model.device))
    results = simple_evaluate(
        lm,
        tasks=list(benchmarks.tasks),
        num_fewshot=benchmarks.num_fewshot,
        limit=benchmarks.limit,
        task_manager=manager,
        log_samples=False,
        apply_chat_template=benchmarks.apply_chat_template,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
    )
    return {task: metrics(values) for task, values in results["results"].items()}


def metrics(values: Dict[str, Any]) -> TaskResults:
    """A task's metrics from the harness's ``"<metric>,<filter>"`` keys: ``exact_match`` for filter ``none``,
    ``exact_match_strict_match`` for another (as ``require:`` can name them), each with its standard error.

    >>> metrics({"alias": "gsm8k", "exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": 0.1,
    ...          "acc,none": 0.5, "acc_stderr,none": "N/A"})
    {'exact_match_strict_match': {'value': 0.25, 'stderr': 0.1}, 'acc': {'value': 0.5, 'stderr': None}}
    """
    found: TaskResults = {}
    for key, value in values.items():
        metric, comma, kept = key.partition(",")
        if not comma or metric.endswith("_stderr"):
            continue
        name = metric if kept == "none" else f"{metric}_{re.sub(r'[^A-Za-z0-9_]', '_', kept)}"
        stderr = values.get(f"{metric}_stderr,{kept}")
        found[name] = {"value": _number(value), "stderr": _number(stderr)}
    return found


def _number(value: Any) -> Optional[float]:
    """A metric's value as a float; None for what the harness could not compute ("N/A")."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
