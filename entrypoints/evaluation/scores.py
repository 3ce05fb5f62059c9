"""What an evaluation's scores say: per model and scorer, the mean, its standard error and pass@k; each model
against the first, prompt by prompt.

A prompt's samples count once together: the mean is over prompts of each
prompt's mean score, and its standard error is that of the prompts' means
(the prompts are the sample; a prompt's own samples are not independent of
each other). A sample *passes* when it scores 1.
"""

import math
import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence

from posttrain.components.spec.conditions import EPISODE_COUNTS

# a score this close to 1 passes (a float sum of weighted parts may fall short by a rounding error)
PASS = 1.0 - 1e-9


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of ``k`` samples drawn without replacement from ``n``, ``c`` of them passing,
    passes: 1 - C(n-c, k) / C(n, k), the unbiased estimator of pass@k (Chen et al., 2021).

    >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 2), pass_at_k(4, 0, 4)
    (0.25, 0.5, 0.0)
    """
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _mean_and_error(values: Sequence[float]) -> Dict[str, Optional[float]]:
    """The mean and its standard error (None from one value: there is no spread to estimate it from)."""
    error = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
    return {"mean": statistics.fmean(values), "stderr": error}


def summarise(
    samples: Sequence[Mapping[str, Any]], models: Sequence[str], scorers: Sequence[str], ks: Sequence[int]
) -> Dict[str, Any]:
    """The summary of ``samples`` (each with ``model``, ``index`` (its prompt's) and ``scores`` by scorer): per
    model and scorer its mean and standard error over prompts, pass@k for each k, and its counts; per later model
    and scorer, its difference from the first model's, prompt by prompt."""
    # model -> scorer -> prompt -> scores
    by_prompt: Dict[str, Dict[str, Dict[int, List[float]]]] = {m: {s: {} for s in scorers} for m in models}
    for sample in samples:
        for scorer in scorers:
            score = sample["scores"][scorer]
            if score is not None:
                by_prompt[sample["model"]][scorer].setdefault(sample["index"], []).append(float(score))
    results: Dict[str, Dict[str, Any]] = {}
    for model in models:
        results[model] = {}
        for scorer in scorers:
            prompts = by_prompt[model][scorer]
            if not prompts:
                results[model][scorer] = {"prompts": 0, "samples": 0}
                continue
            means = [statistics.fmean(scores) for scores in prompts.values()]
            # over the prompts with k scored samples at least (a scorer may leave some unscored: None)
            passes = {
                k: [pass_at_k(len(s), sum(x >= PASS for x in s), k) for s in prompts.values() if len(s) >= k]
                for k in ks
            }
            results[model][scorer] = {
                **_mean_and_error(means),
                "pass_at_k": {str(k): statistics.fmean(values) if values else None for k, values in passes.items()},
                "prompts": len(prompts),
                "samples": sum(len(scores) for scores in prompts.values()),
            }
    comparisons: Dict[str, Dict[str, Any]] = {}
    baseline = models[0]
    for model in models[1:]:
        comparisons[model] = {}
        for scorer in scorers:
            base, other = by_prompt[baseline][scorer], by_prompt[model][scorer]
            both = sorted(set(base) & set(other))
            differences = [statistics.fmean(other[i]) - statistics.fmean(base[i]) for i in both]
            comparisons[model][scorer] = {"against": baseline, "prompts": len(both)}
            if differences:
                comparisons[model][scorer].update(_mean_and_error(differences))
    return {"models": results, "comparisons": comparisons}


def closing_line(
    summary: Mapping[str, Any],
    models: Sequence[str],
    scorers: Sequence[str],
    prompts: Optional[int],
    tasks: Sequence[str] = (),
) -> str:
    """The job's last line: each scorer's mean per model, each later model's difference from the first with its
    standard error (``contains 0.12 -> 0.81 (+0.69 ± 0.03)``); then each benchmark task's first metric per model
    (``gsm8k exact_match 0.10 -> 0.20``). ``prompts``: None where there were no held-out prompts."""
    results, comparisons = summary["models"], summary["comparisons"]
    parts = []
    for scorer in scorers:
        means = " -> ".join(_number(results[model][scorer].get("mean")) for model in models)
        differences = [comparisons[model][scorer] for model in models[1:]]
        shown = ", ".join(
            f"{d['mean']:+.2f} ± {_number(d['stderr'])}" if "mean" in d else "no prompt in common" for d in differences
        )
        if len(models) == 1:
            shown = f"± {_number(results[models[0]][scorer].get('stderr'))}"
        parts.append(f"{scorer} {means} ({shown})")
    for task in tasks:
        measured = [summary["benchmarks"][model].get(task, {}) for model in models]
        metric = next(iter(measured[0]), None)
        if metric is not None:
            means = " -> ".join(_number(m.get(metric, {}).get("value")) for m in measured)
            parts.append(f"{task} {metric} {means}")
    named = f"{len(models)} models ({', '.join(models)})" if len(models) > 1 else models[0]
    counted = "" if prompts is None else f" on {prompts} prompt" + ("s" if prompts != 1 else "")
    return f"posttrain: eval of {named}{counted}: " + "; ".join(parts)


def _number(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def episode_counts(samples: Sequence[Mapping[str, Any]], models: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """Per model, what its episodes did: calls, turns and tokens generated per episode, the share of calls that
    failed and of episodes that hit the limit (rounds or tokens), and the episodes counted."""
    found: Dict[str, Dict[str, Any]] = {}
    for model in models:
        played = [sample["episode"] for sample in samples if sample["model"] == model]
        totals = {count: sum(float(episode.get(count, 0)) for episode in played) for count in EPISODE_COUNTS}
        per_episode = max(len(played), 1)
        found[model] = {
            "episodes": len(played),
            "calls": totals["calls"] / per_episode,
            "failed_calls": totals["failed_calls"] / totals["calls"] if totals["calls"] else 0.0,
            "turns": totals["turns"] / per_episode,
            "hit_limit": totals["hit_limit"] / per_episode,
            "tokens": totals["tokens"] / per_episode,
            # the share of an agent program's episodes that raised or ran out of time (each scored 0)
            "errors": totals["errors"] / per_episode,
        }
    return found
