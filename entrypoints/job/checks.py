"""The inputs checked before any model loads, cheapest first: data, resume, user code, the config, local
models, the tokenizer; what they produce (:class:`Inputs`)."""

import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

import torch

from posttrain.components.spec.fields import config_value
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.schema import Spec
from posttrain.entrypoints.evaluation.run import Inputs as EvaluationInputs
from posttrain.entrypoints.evaluation.run import check as check_evaluation
from posttrain.entrypoints.generation import agents
from posttrain.entrypoints.generation.agents import Program
from posttrain.entrypoints.inputs.chat_templates import check_chat_template, check_reward_templates
from posttrain.entrypoints.inputs.data import (
    check_length_column,
    check_loss_masks,
    check_online_data,
    fit_batch,
    load_split,
    longest_prompt,
)
from posttrain.entrypoints.inputs.models import (
    check_model_options,
    check_model_paths,
    check_weight_shapes,
    load_tokenizer,
)
from posttrain.entrypoints.inputs.rewards import RewardCheck, check_reward_columns, resolve_rewards
from posttrain.entrypoints.inputs.tools import (
    check_environment_column,
    check_episode_template,
    check_tool_data,
    check_tool_template,
    resolve_environment,
    resolve_tools,
)
from posttrain.entrypoints.job.config import build_config, check_environment, training_arguments
from posttrain.entrypoints.job.spec_parts import Parts
from posttrain.entrypoints.records import checkpoints, disk
from posttrain.entrypoints.records.final_model import already_finished
from posttrain.entrypoints.speed import fast_paths

log = logging.getLogger("posttrain")


@dataclasses.dataclass
class Inputs:
    """What the checks before any model loads produce."""

    train_dataset: Any
    eval_dataset: Any
    resume_from: Optional[str]
    rewards: List[Any]
    tools: List[Callable[..., Any]]
    environment_factory: Union[None, Callable[[], Any], Dict[str, Callable[[], Any]]]
    # the agent program that plays each rollout, imported and checked, or None
    agent: Optional[Program]
    args: Any
    tokenizer: Any
    # what each checkpoint records it was trained on (checkpoints.job_inputs)
    record: Dict[str, Any]
    # output_dir holds another run's model, which overwrite_output_dir lets this run write over
    replaces_a_run: bool
    # the evaluate: section's inputs, checked with the run's, or None
    evaluation: Optional[EvaluationInputs]


def check_inputs(spec: Spec, split: Parts, world_size: int, reward_check: RewardCheck) -> Optional[Inputs]:
    """Everything checkable before a model loads, cheapest first; None where output_dir holds this run, finished.

    No collective call in here (see distributed.all_ranks_agree), and nothing written.
    """
    output_dir = split.resume.output_dir
    # an interleaved mixture's draws
    seed = config_value(spec.config_class, spec.training, "seed")
    train_dataset = load_split(spec.data, spec.data_formats, "train", seed)
    datasets = [("data.train", train_dataset)]
    if spec.data.eval is not None:
        datasets.append(("data.eval", load_split(spec.data, spec.data_formats, "eval", seed)))
    # a generating algorithm's batch is tied to num_generations or mini-batches: checked, never shrunk
    training = {**fast_paths.gpu_batch(split.fast_paths, torch.cuda.is_available()), **spec.training}
    if not spec.generates:
        training = fit_batch(training, spec.config_class, len(train_dataset), world_size, spec.min_per_device_batch)
    global_batch = {
        "processes": world_size,
        "per_device_train_batch_size": config_value(spec.config_class, training, "per_device_train_batch_size"),
        "gradient_accumulation_steps": config_value(spec.config_class, training, "gradient_accumulation_steps"),
    }
    inputs_record = checkpoints.job_inputs(split.resume, global_batch, datasets)
    # in every resume mode
    finished = checkpoints.finished_at(split.resume, inputs_record)
    if finished is not None:
        log.info("%s already holds this run, finished at step %d: nothing to train", output_dir, finished)
        return None
    resume_from = checkpoints.resolve_resume(split.resume, inputs_record)
    # told to overwrite, resume: auto may still find the run's last checkpoint: resuming it takes one step too many
    if resume_from is not None and already_finished(output_dir, Path(resume_from), training.get("max_steps", -1)):
        log.info("%s already holds this run, finished at %s: nothing to train", output_dir, resume_from)
        return None
    rewards = resolve_rewards(split.rewards, reward_check)
    tools = resolve_tools(split.tools)
    environment_factory = resolve_environment(split.environment, scored=bool(split.rewards))
    agent = agents.resolve(split.agent) if split.agent is not None else None
    calls = bool(tools) or environment_factory is not None
    if calls:
        check_tool_data(datasets)
    if isinstance(environment_factory, dict):
        check_environment_column(environment_factory, datasets)
    check_reward_columns(split.rewards, spec.keeps_only_prompts, datasets)
    evaluation = None
    if split.evaluation is not None:
        # its data, scorers and tasks now, not after training (the model it evaluates is this run's to make)
        try:
            evaluation = check_evaluation(split.evaluation, made_later=[split.evaluation.models["after"].name_or_path])
        except SpecError as error:
            raise SpecError([f"evaluate.{problem}" for problem in error.problems]) from None
    check_weight_shapes(split.models)
    args = build_config(spec.config_class, training_arguments(spec, training))
    check_online_data(type(spec), args, len(train_dataset), world_size)
    check_length_column(spec.rows_hold_input_ids, args, datasets)
    check_loss_masks(args, datasets)
    check_environment(args)
    check_model_paths(split.models)
    disk.check_room(output_dir, spec.model, saves_checkpoints=args.save_strategy != "no")
    check_model_options(split.models)
    tokenizer = load_tokenizer(spec.model.name_or_path, spec.model, padding_side="left" if spec.generates else "right")
    check_chat_template(args, tokenizer, datasets, spec.model.name_or_path)
    check_reward_templates(rewards, spec.model, datasets)
    if calls:
        check_tool_template(tokenizer, spec.model.name_or_path)
    if agent is not None:
        # its endpoint renders the rollouts with the training template and reads the calls back as TRL does
        check_episode_template(tokenizer, spec.model.name_or_path, "agent")
    split_step = fast_paths.micro_batches(
        split.fast_paths,
        torch.cuda.is_available(),
        args,
        lambda: longest_prompt(tokenizer, train_dataset, tools, args.chat_template_kwargs),
    )
    if split_step:
        args = build_config(spec.config_class, training_arguments(spec, {**training, **split_step}))
    eval_dataset = datasets[1][1] if len(datasets) > 1 else None
    return Inputs(
        train_dataset,
        eval_dataset,
        resume_from,
        rewards,
        tools,
        environment_factory,
        agent,
        args,
        tokenizer,
        inputs_record,
        split.resume.overwrite and checkpoints.holds_a_run(output_dir),
        evaluation,
    )
