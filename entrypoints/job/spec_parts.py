"""The spec, read once: :func:`parts` splits it into what the job's steps take, as ``sharding.Strategy``
takes ``distributed``."""

import dataclasses
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

from posttrain.components.spec.evaluation import of_training_run
from posttrain.components.spec.generation import TrainingGeneration
from posttrain.components.spec.schema import Spec
from posttrain.components.spec.sections import AgentSection, EnvironmentSource, EpisodeProgram, RewardSource, ToolSource
from posttrain.entrypoints.evaluation.parts import EvalParts
from posttrain.entrypoints.evaluation.parts import parts as evaluation_parts
from posttrain.entrypoints.inputs.models import ModelLoading
from posttrain.entrypoints.records.checkpoints import Resume
from posttrain.entrypoints.speed import fast_paths
from posttrain.entrypoints.speed.fast_paths import FastPathOptions


@dataclasses.dataclass(frozen=True)
class Parts:
    """The spec, read once (:func:`parts`): what the job's steps are handed instead of the whole spec."""

    models: ModelLoading
    fast_paths: FastPathOptions
    resume: Resume
    # none where the algorithm scores nothing
    rewards: Tuple[RewardSource, ...]
    # the functions the model may call, none where the spec gives none
    tools: Tuple[ToolSource, ...]
    # the environment classes the model acts in (one, or several by name), or None
    environment: Union[EnvironmentSource, Dict[str, EnvironmentSource], None]
    # the agent program (or verifiers environment) that plays each rollout, or None
    agent: Optional[EpisodeProgram]
    # the evaluation of the saved model (evaluate:), or None
    evaluation: Optional[EvalParts]
    # how the trainers and the vllm role take turns (GRPO's and RLOO's generation:), or None
    generation: Optional[TrainingGeneration]


def parts(spec: Spec) -> Parts:
    """The spec split into the parts the job's steps take."""
    options = FastPathOptions(
        offered=spec.fast_paths,
        config_class=spec.config_class,
        model=spec.model,
        training=dict(spec.training),
        sharded=spec.distributed.sharding is not None,
        # TRL's GRPO and RLOO trainers' passes (PPO's trainer packs its own)
        rl_passes=spec.groups,
    )
    models = ModelLoading(
        spec.model,
        model_class=spec.model_class,
        lora_task=spec.lora_task,
        attention=fast_paths.attention_implementation(options),
        extra_models=spec.extra_model_paths(),
        router_aux_loss_coef=spec.training.get("router_aux_loss_coef"),
    )
    resume = Resume(
        output_dir=Path(spec.training["output_dir"]),
        mode=spec.resume,
        overwrite=spec.overwrite_output_dir,
        spec_record=spec.model_dump(mode="json"),
        models=spec.named_models(),
        revision=spec.model.revision,
        data=spec.data,
    )
    return Parts(
        models,
        options,
        resume,
        rewards=tuple(getattr(spec, "rewards", ())),
        tools=tuple(getattr(spec, "tools", ())),
        environment=spec.environment_classes() if isinstance(spec, AgentSection) else None,
        agent=spec.program() if isinstance(spec, AgentSection) else None,
        evaluation=evaluation_parts(of_training_run(spec)) if spec.evaluate is not None else None,
        generation=getattr(spec, "generation", None),
    )
