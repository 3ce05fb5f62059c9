"""An evaluation's ``require:`` conditions: what its scores must show for the job to succeed.

    require:
      - sft.regex_format >= 0.5                      # a model's mean score
      - sft.regex_format - base.regex_format >= 0.3  # against another model of the same evaluation
      - sft.contains.pass@4 > 0.2                    # its pass@k (a k of pass_at_k)
      - sft.gsm8k.exact_match >= 0.3                 # a benchmark task's metric (lm-evaluation-harness)

A metric is ``<model>.<scorer>`` (its mean), ``<model>.<scorer>.pass@<k>``,
``<model>.<task>.<metric>`` or, where the samples are episodes,
``<model>.episodes.<count>`` (calls, failed_calls, turns, hit_limit,
tokens); a condition compares one metric, or the
difference of two, with a number. A scorer's metric counts only on
``require_min_samples`` scored samples at least (:data:`MIN_SAMPLES`
unless set): on fewer, the condition does not hold, and says why; so
does a metric the results lack.
"""

import dataclasses
import operator
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

_METRIC = r"[a-z][a-z0-9_]*\.[A-Za-z0-9_]+(?:\.(?:pass@\d+|[A-Za-z_]\w*))?"
_CONDITION = re.compile(
    rf"\s*(?P<left>{_METRIC})\s*(?:-\s*(?P<right>{_METRIC})\s*)?(?P<op>>=|<=|>|<)\s*"
    r"(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*"
)
COMPARISONS: Dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}
# where an evaluation's episodes are counted (a sample is one where the spec gives tools or an environment):
# <model>.episodes.<count>, a count of scores.episode_counts
EPISODES = "episodes"
EPISODE_COUNTS = ("calls", "failed_calls", "turns", "hit_limit", "tokens", "errors")
# the scored samples a scorer's metric needs, where require_min_samples is not set: fewer say little (a mean of 0 or
# 1 on a handful of samples is noise), and a tiny evaluation (a few prompts, 4 samples each) has as many
MIN_SAMPLES = 16
EXAMPLE = "e.g. sft.contains >= 0.5, sft.contains - base.contains >= 0.05, or sft.contains.pass@4 > 0.8"


@dataclasses.dataclass(frozen=True)
class Metric:
    model: str
    # a scorer's name, or a benchmark task's
    scorer: str
    # pass@k; None: the mean
    k: Optional[int] = None
    # a benchmark task's metric (its name in the summary)
    measure: Optional[str] = None

    @classmethod
    def parse(cls, text: str) -> "Metric":
        model, scorer, *rest = text.split(".")
        if rest and re.fullmatch(r"pass@\d+", rest[0]):
            return cls(model, scorer, k=int(rest[0].removeprefix("pass@")))
        return cls(model, scorer, measure=rest[0] if rest else None)

    def __str__(self) -> str:
        suffix = f".pass@{self.k}" if self.k is not None else f".{self.measure}" if self.measure else ""
        return f"{self.model}.{self.scorer}{suffix}"

    def value(self, summary: Mapping[str, Any], min_samples: int) -> Tuple[Optional[float], str]:
        """Its value in an evaluation's summary, and why there is none (nothing was scored, on too few samples, or
        the results have no such metric)."""
        if self.scorer == EPISODES and self.measure is not None:
            counted = summary.get("episodes", {}).get(self.model)
            if counted is None or self.measure not in counted or self.measure == "episodes":
                return None, f"{self} is not in the results"
            if counted["episodes"] < min_samples:
                return None, (
                    f"{self.model} played {counted['episodes']} episode(s), fewer than the {min_samples} a condition "
                    "needs (require_min_samples)"
                )
            return counted[self.measure], ""
        if self.measure is not None:
            task = summary.get("benchmarks", {}).get(self.model, {}).get(self.scorer, {})
            value = task.get(self.measure, {}).get("value")
            return value, "" if value is not None else f"{self} is not in the results"
        result = summary.get("models", {}).get(self.model, {}).get(self.scorer)
        if result is None:
            return None, f"{self} is not in the results"
        if result.get("samples", 0) < min_samples:
            return None, (
                f"{self.model}.{self.scorer} scored {result.get('samples', 0)} sample(s), fewer than the "
                f"{min_samples} a condition needs (require_min_samples)"
            )
        value = result.get("mean") if self.k is None else result.get("pass_at_k", {}).get(str(self.k))
        return value, "" if value is not None else f"{self} is not in the results"


@dataclasses.dataclass(frozen=True)
class Condition:
    text: str
    left: Metric
    right: Optional[Metric]
    op: str
    number: float

    @classmethod
    def parse(cls, text: str) -> "Condition":
        match = _CONDITION.fullmatch(text)
        if match is None:
            raise ValueError(f"expected <model>.<scorer> (or a difference of two) compared with a number ({EXAMPLE})")
        right = Metric.parse(match["right"]) if match["right"] else None
        return cls(" ".join(text.split()), Metric.parse(match["left"]), right, match["op"], float(match["number"]))

    def metrics(self) -> List[Metric]:
        return [self.left] + ([self.right] if self.right is not None else [])

    def verdict(self, summary: Mapping[str, Any], min_samples: int = MIN_SAMPLES) -> Dict[str, Any]:
        """Whether it holds in ``summary``, with the values it was judged on; a metric without a value (nothing
        scored, too few samples, not in the results) fails it, and the verdict says why."""
        judged = {str(metric): metric.value(summary, min_samples) for metric in self.metrics()}
        values = {name: value for name, (value, _) in judged.items()}
        value: Optional[float] = None
        if None not in values.values():
            value = values[str(self.left)] - (values[str(self.right)] if self.right is not None else 0.0)
        held = value is not None and COMPARISONS[self.op](value, self.number)
        why = "; ".join(reason for _, reason in judged.values() if reason)
        return {"condition": self.text, "values": values, "value": value, "held": held, "why": why}


def problems(
    conditions: Sequence[str],
    models: Sequence[str],
    scorers: Sequence[str],
    ks: Sequence[int],
    tasks: Sequence[str] = (),
) -> List[str]:
    """What is wrong with each condition, ``require.<i>: ...``: its form, and the models, scorers, k and benchmark
    tasks it names (a task's metrics are known once it has run)."""
    found = []
    for index, text in enumerate(conditions):
        where = f"require.{index}"
        try:
            condition = Condition.parse(text)
        except ValueError as error:
            found.append(f"{where}: {text!r}: {error}")
            continue
        if condition.right == condition.left:
            found.append(f"{where}: {text!r} compares {condition.left} with itself; name another model's metric")
            continue
        for metric in condition.metrics():
            named = [*scorers, *tasks]
            if metric.model not in models:
                found.append(f"{where}: no model {metric.model!r} in this evaluation; it has {', '.join(models)}")
            elif metric.scorer not in named:
                found.append(
                    f"{where}: no scorer or benchmark task {metric.scorer!r} in this evaluation; it has "
                    f"{', '.join(named)}"
                )
            elif metric.scorer == EPISODES and metric.measure not in EPISODE_COUNTS:
                found.append(f"{where}: {metric} is not counted; an episode counts {', '.join(EPISODE_COUNTS)}")
            elif metric.scorer in tasks and metric.measure is None:
                found.append(f"{where}: name the task's metric: {metric}.<metric> (e.g. {metric}.exact_match)")
            elif metric.scorer in scorers and metric.measure is not None:
                found.append(
                    f"{where}: a scorer has its mean and pass@k, not {metric.measure!r}: write {metric.model}.{metric.scorer}"
                )
            elif metric.k is not None and metric.k not in ks:
                found.append(f"{where}: pass@{metric.k} is not computed; add {metric.k} to pass_at_k")
    return found


def failure(verdict: Mapping[str, Any]) -> str:
    """One line for a condition that does not hold, naming it and the values it was judged on."""
    values = ", ".join(f"{name} {'n/a' if v is None else f'{v:.4g}'}" for name, v in verdict["values"].items())
    shown = (
        f"; difference {verdict['value']:.4g}" if len(verdict["values"]) > 1 and verdict["value"] is not None else ""
    )
    why = f" ({verdict['why']})" if verdict.get("why") else ""
    return f"require: {verdict['condition']} does not hold: {values}{shown}{why}"
