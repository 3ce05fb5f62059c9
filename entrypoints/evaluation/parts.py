"""An evaluation's spec, read once (:func:`parts`): what its steps take, as a training job's steps take theirs
(``job/spec_parts.py``). ``posttrain.eval``'s spec and a training spec's ``evaluate:`` section read alike."""

import dataclasses
import json
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

from posttrain.components.spec.evaluation import EvalSpec
from posttrain.components.spec.judging import BenchmarksSpec, EvalData, GenerationSpec
from posttrain.components.spec.sections import EnvironmentSource, EpisodeProgram, ModelSpec, RewardSource, ToolSource

# spec keys the results do not depend on
NOT_RESULTS = ("output_dir", "overwrite_output_dir", "require", "require_min_samples")


@dataclasses.dataclass(frozen=True)
class EvalParts:
    """An evaluation, as its steps take it."""

    output_dir: Path
    # write over another evaluation's results in output_dir
    overwrite: bool
    models: Dict[str, ModelSpec]
    # each model by where the spec names it (``models.<name>.name_or_path``)
    named_models: Tuple[Tuple[str, str], ...]
    # the held-out prompts, or None: benchmarks alone
    data: Optional[EvalData]
    data_formats: Tuple[Tuple[str, ...], ...]
    rewards: Tuple[RewardSource, ...]
    # what each sample may call, where it is an episode (episodes.py)
    tools: Tuple[ToolSource, ...]
    environment: Union[EnvironmentSource, Dict[str, EnvironmentSource], None]
    # an agent program (or a verifiers environment) that plays each episode instead (generation/agents.py)
    agent: Optional[EpisodeProgram]
    # whether each sample is an episode (tools, environments or an agent program)
    is_agentic: bool
    # each scorer's name in the summary, in the order of rewards
    scorer_names: Tuple[str, ...]
    benchmarks: Optional[BenchmarksSpec]
    generation: GenerationSpec
    pass_at_k: Tuple[int, ...]
    # the conditions the scores must meet (conditions.py)
    require: Tuple[str, ...]
    # the scored samples a scorer's metric needs for a condition to hold on it
    require_min_samples: int
    # the spec as its results depend on it: not where they are written, nor whether they may replace others
    results_spec: Dict[str, Any]


def parts(spec: EvalSpec) -> EvalParts:
    """The evaluation's spec split into the parts its steps take."""
    return EvalParts(
        output_dir=Path(spec.output_dir),
        overwrite=spec.overwrite_output_dir,
        models=dict(spec.models),
        named_models=tuple(spec.named_models()),
        data=spec.data,
        data_formats=spec.data_formats,
        rewards=tuple(spec.rewards),
        tools=tuple(spec.tools),
        environment=spec.environment_classes(),
        agent=spec.program(),
        is_agentic=spec.is_agentic(),
        scorer_names=tuple(spec.scorer_names()),
        benchmarks=spec.benchmarks,
        generation=spec.generation,
        pass_at_k=tuple(spec.pass_at_k),
        require=tuple(spec.require),
        require_min_samples=spec.require_min_samples,
        results_spec={key: value for key, value in json.loads(spec.to_json()).items() if key not in NOT_RESULTS},
    )
