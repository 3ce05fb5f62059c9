"""What a gate trusts: results reused only while what decides a score is the same, and a summary judged only as the
evaluation wrote it.

A score is decided by the samples (the models, the data, the generation
settings, the engine, and for episodes the tools' and environments' code:
``run.py``'s record) and by the scorers' code: a function's module (its
file's bytes), a built-in's module and posttrain's version, a reward
model's weights (by content). The scorers' fingerprints are kept apart from
the rest, so that a scorer whose code changed re-scores the samples kept
(the spec's rewards themselves are part of what samples: other rewards are
another evaluation). An episode's scores are not re-scored (its
environment, which scores it, is gone): for episodes the scorers are part
of what samples. Where what samples changed and the spec did not (a model
trained again in place, a tool's code edited), the results are sampled
again (``results.finished``).

A finished summary carries a seal: the digest of its own content and of
the samples it was computed from. A summary, or samples, edited by hand no
longer match it, and a gate refuses them in one line.
"""

import hashlib
import importlib.util
import inspect
import json
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Union

from posttrain.components.spec import code_runs
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.rewards import BUILTIN_REWARDS
from posttrain.components.spec.sections import (
    EnvironmentSource,
    EpisodeProgram,
    RewardSource,
    ToolSource,
    VerifiersEnvironment,
)
from posttrain.entrypoints.evaluation.files import SAMPLES_FILE, SUMMARY_FILE
from posttrain.entrypoints.inputs.verifiers_tasks import taskset_module
from posttrain.entrypoints.records.fingerprints import file_digest, model_fingerprint

# what a built-in scores with beside its function's module (components/spec/rewards.py): code_tests' runner and
# sandbox, math_verify's package
BUILTIN_CODE = {"code_tests": [Path(code_runs.__file__), *sorted(code_runs.HARNESS.glob("*.py"))]}
BUILTIN_PACKAGES = {"math_verify": ["math-verify"]}
# the summary's keys its seal does not cover: the conditions are judged again on every run (they may change)
NOT_SEALED = ("require", "seal")
REMEDY = "remove the directory's eval_* files to evaluate again, or use another output_dir"


def scorer_fingerprints(rewards: Sequence[RewardSource]) -> Dict[str, Any]:
    """What decides each scorer's scores, by its place in ``rewards``: its code, or a reward model's weights."""
    found: Dict[str, Any] = {}
    for index, reward in enumerate(rewards):
        if reward.builtin is not None:
            files = [Path(inspect.getfile(BUILTIN_REWARDS[reward.builtin])), *BUILTIN_CODE.get(reward.builtin, [])]
            found[str(index)] = {
                "code": [file_digest(path) for path in files],
                "posttrain": metadata.version("posttrain"),
                **{package: metadata.version(package) for package in BUILTIN_PACKAGES.get(reward.builtin, [])},
            }
        elif reward.function is not None:
            found[str(index)] = {"code": _module_digest(reward.function.partition(":")[0])}
        else:
            found[str(index)] = {"model": model_fingerprint(str(reward.model))}
    return found


def agent_fingerprints(
    tools: Sequence[ToolSource],
    environment: Union[EnvironmentSource, Dict[str, EnvironmentSource], None],
    program: Optional[EpisodeProgram],
) -> Dict[str, Any]:
    """What decides an episode besides the model: each tool's, environment's and agent program's module (its
    file's bytes; a verifiers environment's, its taskset's)."""
    environments = environment if isinstance(environment, dict) else {"": environment} if environment else {}
    found: Dict[str, Any] = {
        "tools": [_module_digest(tool.function.partition(":")[0]) for tool in tools],
        "environments": {
            name: _module_digest(source.factory.partition(":")[0]) for name, source in environments.items()
        },
    }
    if isinstance(program, VerifiersEnvironment):
        found["program"] = _module_digest(taskset_module(program.verifiers))
    elif program is not None:
        found["program"] = _module_digest(program.function.partition(":")[0])
    return found


def _module_digest(module: str) -> Optional[str]:
    """The digest of the file a module is read from (None: one with no file of its own, a built-in module)."""
    found = importlib.util.find_spec(module)
    origin = found.origin if found is not None else None
    return file_digest(Path(origin)) if origin and Path(origin).is_file() else None


def sealed(summary: Dict[str, Any], samples: Path) -> Dict[str, Any]:
    """``summary`` with its seal: the digest of its content and of the samples file it was computed from."""
    summary["samples_sha256"] = file_digest(samples) if samples.is_file() else None
    summary["seal"] = _digest(summary)
    return summary


def check_sealed(summary: Mapping[str, Any], output_dir: Path) -> None:
    """Raises, in one line, where ``summary`` or its samples are not as the evaluation wrote them."""
    if "seal" not in summary:
        raise SpecError(
            [
                f"output_dir: {output_dir / SUMMARY_FILE} has no seal (written before posttrain sealed its results, "
                f"or by another tool), so no gate judges it; {REMEDY}"
            ]
        )
    if summary.get("seal") != _digest(summary):
        raise SpecError(
            [
                f"output_dir: {output_dir / SUMMARY_FILE} is not as the evaluation wrote it (edited by hand, or "
                f"written by another tool), so no gate judges it; {REMEDY}"
            ]
        )
    samples = output_dir / SAMPLES_FILE
    if summary.get("samples_sha256") != (file_digest(samples) if samples.is_file() else None):
        raise SpecError(
            [
                f"output_dir: {samples} is not the file {SUMMARY_FILE} was computed from (edited, replaced or "
                f"removed), so no gate judges it; {REMEDY}"
            ]
        )


def _digest(summary: Mapping[str, Any]) -> str:
    content = {key: value for key, value in summary.items() if key not in NOT_SEALED}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
