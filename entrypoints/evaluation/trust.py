"""What a gate trusts: results reused only while what decides a score is the same, and a summary judged only as the
evaluation wrote it.

A score is decided by the samples (the models, the data, the generation
settings, the engine, and for episodes the tools' and environments' code:
``run.py``'s record) and by the scorers' code: a function's module (its
file's bytes), a built-in's module and posttrain's version, a reward
model's weights (by content). The scorers' fingerprints are kept apart from
the rest, so that new scorers re-score the samples kept, and new samples
are drawn only where what samples changed. An episode's scores are not
re-scored (its environment, which scores it, is gone): for episodes the
scorers are part of what samples.

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

from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.rewards import BUILTIN_REWARDS
from posttrain.components.spec.sections import EnvironmentSource, RewardSource, ToolSource
from posttrain.entrypoints.evaluation.files import SAMPLES_FILE, SUMMARY_FILE
from posttrain.entrypoints.records.fingerprints import file_digest, model_fingerprint

# the summary's keys its seal does not cover: the conditions are judged again on every run (they may change)
NOT_SEALED = ("require", "seal")
REMEDY = "remove the directory's eval_* files to evaluate again, or use another output_dir"


def scorer_fingerprints(rewards: Sequence[RewardSource]) -> Dict[str, Any]:
    """What decides each scorer's scores, by its place in ``rewards``: its code, or a reward model's weights."""
    found: Dict[str, Any] = {}
    for index, reward in enumerate(rewards):
        if reward.builtin is not None:
            module = Path(inspect.getfile(BUILTIN_REWARDS[reward.builtin]))
            found[str(index)] = {"code": file_digest(module), "posttrain": metadata.version("posttrain")}
        elif reward.function is not None:
            found[str(index)] = {"code": _module_digest(reward.function.partition(":")[0])}
        else:
            found[str(index)] = {"model": model_fingerprint(str(reward.model))}
    return found


def agent_fingerprints(
    tools: Sequence[ToolSource], environment: Union[EnvironmentSource, Dict[str, EnvironmentSource], None]
) -> Dict[str, Any]:
    """What decides an episode besides the model: each tool's and environment's module (its file's bytes)."""
    environments = environment if isinstance(environment, dict) else {"": environment} if environment else {}
    return {
        "tools": [_module_digest(tool.function.partition(":")[0]) for tool in tools],
        "environments": {
            name: _module_digest(source.factory.partition(":")[0]) for name, source in environments.items()
        },
    }


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
