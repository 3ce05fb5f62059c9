"""The life of a job, which every algorithm's entrypoint shares.

An entrypoint calls :func:`run` with its algorithm's name and the function
that builds its trainer from a :class:`Job` (the trainer's constructor, called
in the entrypoint, as in TRL's own scripts). :func:`run` does the rest, in an
order that fails early and cheaply:

1. parse and re-validate the spec (``--spec-json``), before importing a model;
2. create the process group with ``distributed.timeout_s`` on every backend
   (with ``use_cpu`` transformers ignores ``ddp_timeout``);
3. check everything a model is not needed for, on every rank, then agree
   across ranks (:func:`distributed.all_ranks_agree`): rank 0 takes the
   lease on ``output_dir`` (``lease.py``: another live run there is an
   error), load the data and check its columns and values, fit the batch to
   its size, resolve ``resume`` (the newest sound checkpoint; one of a
   different spec, data or global batch is an error), import reward
   functions, build the TRL config (``use_cpu`` from the hardware; its own
   checks' ValueErrors become ``training:`` lines), look up what it needs
   of the environment (the optimizer's and loggers' packages, a Hub token),
   check every local model directory, build the model on the meta device
   (its attention implementation, its LoRA targets), load the tokenizer;
4. only then write into ``output_dir`` (``posttrain_spec.json``), and build
   the trainer with its models (and SFT's padding-free collator);
5. train, every reward function's scores checked at each step's end on all
   ranks together; then save the unwrapped model, the tokenizer,
   ``trainer_state.json`` and ``run_summary.json`` into ``output_dir``.

Input errors (a missing file, a corrupt line, wrong columns, a data set too
small, a NaN reward, a full disk) end every rank with exit code 2 and one
``posttrain: <problem>`` line, printed by rank 0 alone, without a traceback
(a model that fails to load on one node only: by the ranks that met it), and
left in torchelastic's error file for torchx. Anything else is a crash (exit
code 1): one line, said once by posttrain's launcher, its traceback kept in
``output_dir/logs`` (``error_file.record_crash``); a rank that ended because
another did says nothing. A ``sys.exit`` in the user's code is one line naming
it (``inputs/user_code.py`` bounds each call; elsewhere its frame is named
here), never a quiet end. A success ends in one line (``summary.closing_line``).

The spec is read once, at the start (:func:`parts`): each step is handed its
part (how models load, the fast paths' options, what resume is decided from,
the rewards), as ``sharding.Strategy`` is handed ``distributed``; only this
module's steps and :func:`training_arguments` see the whole spec.

What happens where: ``distributed.py`` (the process group), ``sharding.py``
(DDP, DeepSpeed, FSDP), ``inputs/`` (data, models, rewards), ``lease.py``
(one run per ``output_dir``), ``records/checkpoints.py`` (resume),
``records/summary.py`` (``run_summary.json``), ``speed/fast_paths.py``.
"""

import argparse
import contextlib
import dataclasses
import gc
import importlib.util
import logging
import os
import signal
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, NoReturn, Optional, Sequence, Tuple, Union

import torch
from transformers import PrinterCallback, Trainer
from transformers.integrations.deepspeed import unset_hf_deepspeed_config
from transformers.utils import logging as transformers_logging

from posttrain.components.spec.evaluation import EvalSpec, of_training_run
from posttrain.components.spec.fields import config_fields, config_value
from posttrain.components.spec.generation import TrainingGeneration
from posttrain.components.spec.loading import spec_from_json
from posttrain.components.spec.messages import SpecError, first_line
from posttrain.components.spec.schema import CHECKPOINTING_OPTIONS, Spec
from posttrain.components.spec.sections import EnvironmentSource, RewardSource, ToolSource
from posttrain.entrypoints.evaluation.run import Inputs as EvaluationInputs
from posttrain.entrypoints.evaluation.run import check as check_evaluation
from posttrain.entrypoints.evaluation.run import evaluate_run
from posttrain.entrypoints.generation import role_lease, run_ahead, vllm_generation, vllm_token
from posttrain.entrypoints.inputs.chat_templates import check_chat_template, check_reward_templates
from posttrain.entrypoints.inputs.data import (
    check_kept_rows,
    check_length_column,
    check_loss_masks,
    check_online_data,
    fit_batch,
    load_split,
    longest_prompt,
)
from posttrain.entrypoints.inputs.models import (
    ModelLoading,
    check_model_options,
    check_model_paths,
    check_weight_shapes,
    import_object,
    load_extra_model,
    load_model,
    load_tokenizer,
    lora_config,
    model_config,
)
from posttrain.entrypoints.inputs.rewards import RewardCheck, check_reward_columns, load_reward_models, resolve_rewards
from posttrain.entrypoints.inputs.tools import (
    check_environment_column,
    check_tool_data,
    check_tool_template,
    resolve_environment,
    resolve_tools,
)
from posttrain.entrypoints.job.callbacks import BestMetricCheck, FaultInjection, Preemption, ProgressLog, TokenCounter
from posttrain.entrypoints.job.sharding import may_leave_parameters_unused, strategy_for
from posttrain.entrypoints.process import distributed, lease
from posttrain.entrypoints.process.error_file import CRASHED, KEPT_LOGS, STOPPED, Exit, record_crash, record_error
from posttrain.entrypoints.records import checkpoints
from posttrain.entrypoints.records.checkpoints import SPEC_FILE, Resume, already_finished, at_last_step
from posttrain.entrypoints.records.files import write_json_atomic
from posttrain.entrypoints.records.metrics import MetricsLog
from posttrain.entrypoints.records.samples import RolloutSamples
from posttrain.entrypoints.records.summary import SUMMARY_FILE, closing_line, run_summary, say_closing, write_model_card
from posttrain.entrypoints.speed import fast_paths
from posttrain.entrypoints.speed.fast_paths import FastPathOptions

log = logging.getLogger("posttrain")


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
    # the environment the model acts in (one, or several by name), or None
    environment: Union[EnvironmentSource, Dict[str, EnvironmentSource], None]
    # the evaluation of the saved model (evaluate:), or None
    evaluation: Optional[EvalSpec]
    # how the trainers and the vllm role take turns (GRPO's and RLOO's generation:), or None
    generation: Optional[TrainingGeneration]


def parts(spec: Spec) -> Parts:
    """The spec split into the parts the job's steps take."""
    options = _fast_path_options(spec)
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
        environment=getattr(spec, "environment", None),
        evaluation=of_training_run(spec) if spec.evaluate is not None else None,
        generation=getattr(spec, "generation", None),
    )


def _fast_path_options(spec: Spec) -> FastPathOptions:
    return FastPathOptions(
        offered=spec.fast_paths,
        config_class=spec.config_class,
        model=spec.model,
        training=dict(spec.training),
        sharded=spec.distributed.sharding is not None,
        # TRL's GRPO and RLOO trainers' passes (PPO's trainer packs its own)
        rl_passes=spec.groups,
    )


@dataclasses.dataclass
class Job:
    """What a trainer is built from: the TRL config, the data, the callbacks, and loaders for the models."""

    models: ModelLoading
    fast_paths: FastPathOptions
    # the algorithm's TRL config instance (SFTConfig, ...)
    args: Any
    tokenizer: Any
    train_dataset: Any
    eval_dataset: Any
    callbacks: List[Any]
    # reward functions, and reward-model paths that load_rewards loads
    rewards: List[Any]
    # each reward's weight, in the order of rewards
    reward_weights: List[float]
    # the functions the model may call (the spec's tools, imported and checked)
    tools: List[Callable[..., Any]]
    # what builds each rollout's environment (one factory, or several by name), or None
    environment_factory: Union[None, Callable[[], Any], Dict[str, Callable[[], Any]]]
    # how the trainers and the vllm role take turns, or None (Parts.generation)
    generation: Optional[TrainingGeneration] = None

    def load_model(self) -> Any:
        """The model to train: ``model.name_or_path`` with the algorithm's ``model_class``, quantized where
        ``model.quantization`` says."""
        return load_model(self.models.name_or_path, self.models, self.tokenizer, self.models.model_class, trained=True)

    def load_extra_model(self, field: str) -> Any:
        """The model the spec field ``field`` names (``reference_model``, ``teacher_model``, ``value_model``), loaded
        with the tokenizer checked against the policy's; None where there is none (a reference under LoRA)."""
        return load_extra_model(field, self.models, self.tokenizer)

    def load_rewards(self) -> Tuple[List[Any], List[Optional[Any]]]:
        """``(reward_funcs, reward_processing_classes)`` with the reward models loaded."""
        return load_reward_models(self.rewards, self.models)

    def data_collator(self, model: Any) -> Optional[Any]:
        """The collator for ``model``: TRL's own, padding-free where that fast path takes it; None leaves TRL's
        choice (fast_paths.data_collator)."""
        return fast_paths.data_collator(self.fast_paths, model, self.tokenizer, self.args, self.train_dataset)

    @property
    def peft_config(self) -> Optional[Any]:
        """PEFT's LoraConfig from ``model.lora``, or None."""
        return lora_config(self.models)


def run(algorithm: str, build_trainer: Callable[[Job], Any], argv: Optional[Sequence[str]] = None) -> None:
    """Runs one training job: the whole life of an entrypoint; ``build_trainer`` builds its trainer from the
    :class:`Job`, once every check has passed."""
    parser = argparse.ArgumentParser(prog=f"python -m posttrain.entrypoints.{algorithm}")
    parser.add_argument("--spec-json", required=True, help="the validated spec, as the component embedded it")
    options = parser.parse_args(argv)
    # before any user code: reward functions do not inherit it
    vllm_token.take_from_environment()
    distributed.setup_logging()
    distributed.end_with_the_launchers_parent()
    quiet_libraries()
    with ends_in_one_line() as ending:
        spec = spec_from_json(options.spec_json)
        ending.logs = Path(spec.training["output_dir"]) / "logs"
        if spec.algorithm != algorithm:
            raise SpecError([f"algorithm: the spec is for {spec.algorithm!r}, this entrypoint runs {algorithm!r}"])
        # a job with a vllm role: rank 0 tells it when training ends
        with role_lease.lease(spec.training):
            _train(algorithm, spec, build_trainer)
    distributed.report_done()


def main(algorithm: str, build_trainer: Callable[[Job], Any]) -> NoReturn:
    """An entrypoint's process: :func:`run`, then the process ends as soon as its work is done
    (``distributed.end_process``)."""
    distributed.exit_after(lambda: run(algorithm, build_trainer))


@dataclasses.dataclass
class Ending:
    """Where a crash's traceback is kept: the run's ``logs`` directory, once the spec that names it is read."""

    logs: Optional[Path] = None


@contextlib.contextmanager
def ends_in_one_line() -> Iterator[Ending]:
    """How a job's process ends when something stops it: a SpecError in one ``posttrain:`` line (exit 2), anything
    else recorded whole, its traceback kept in the ending's ``logs`` (exit 1); the process group destroyed either
    way."""
    ending = Ending()
    try:
        yield ending
    except SpecError as error:
        # every rank meets the same error (the checks agree across ranks, see distributed.all_ranks_agree): one says
        # it; an error this rank may have met alone is said by this rank (else the job would end without a word)
        if distributed.env_rank() == 0 or error.this_rank_only:
            print(f"posttrain: {error}", file=sys.stderr, flush=True)
        # every rank: whichever torchrun names the root cause
        record_error(f"posttrain: {error}")
        raise SystemExit(STOPPED) from None
    except Exit:
        raise
    except SystemExit as exit:
        # sys.exit where posttrain does not bound the call (user_code.py does): a run never ends quietly half-done
        line = f"posttrain: rank {distributed.env_rank()}: {_called_exit(exit)}; the job stops"
        print(line, file=sys.stderr, flush=True)
        record_error(line)
        raise SystemExit(STOPPED) from None
    except Exception as error:
        # else another rank ended first and says why
        if not distributed.lost_a_peer(error):
            record_crash(error, distributed.env_rank(), ending.logs)
        raise SystemExit(CRASHED) from None
    finally:
        distributed.destroy_process_group()


def _called_exit(exit: SystemExit) -> str:
    """Where a ``sys.exit`` came from, as a line says it: its exit code and the innermost frame that raised it."""
    frames = traceback.extract_tb(exit.__traceback__)
    # sys.exit itself has no Python frame: the last one is its caller's
    where = f" in {frames[-1].name} ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"sys.exit({exit.code!r}) was called{where} while the job ran"


def built_trainer(job: Job, build_trainer: Callable[[Job], Any]) -> Any:
    """The entrypoint's trainer, its passes over generated completions padding-free where they can be
    (GRPO's, RLOO's: fast_paths.switch_passes_to_padding_free), its vLLM generation bounded in time and taking turns
    with the vllm role (run_ahead)."""
    trainer = build_trainer(job)
    if job.fast_paths.rl_passes:
        fast_paths.switch_passes_to_padding_free(trainer)
    args = getattr(trainer, "args", None)
    if job.generation is not None and getattr(args, "use_vllm", False):
        # a generation that never ends is one line naming the engine and the step
        run_ahead.bound_generation(trainer, job.generation)
        if args.vllm_mode == "server":
            run_ahead.install(trainer, job.generation)
    return trainer


def train_no_step(trainer: Any) -> None:
    """Makes ``trainer.train(resume_from_checkpoint=...)`` restore the checkpoint (model, optimizer, state; the best
    model where ``load_best_model_at_end`` asks) and end as training ends, without a step: the Trainer would take one
    step past a checkpoint at ``max_steps`` where ``max_steps`` is no whole number of epochs. Its epochs are its
    ``_run_epoch`` (transformers 5); posttrain's PPO trainer takes no step past ``max_steps`` by itself."""
    if hasattr(trainer, "_run_epoch"):
        trainer._run_epoch = lambda *args, **kwargs: None


def quiet_libraries() -> None:
    """What libraries print that tells a user nothing: DeepSpeed's warning from every rank that it found no GPU (on
    a CPU job), the progress bars of saving and loading weights in a log (a file or a pipe, not a terminal), and
    TRL's use of a name transformers deprecated."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if not sys.stderr.isatty():
        transformers_logging.disable_progress_bar()
    # TRL 1.16 asks transformers 5 for the flag by its old name, from every rank: nothing the user can change
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


@dataclasses.dataclass
class _Inputs:
    """What the checks before any model loads produce."""

    train_dataset: Any
    eval_dataset: Any
    resume_from: Optional[str]
    rewards: List[Any]
    tools: List[Callable[..., Any]]
    environment_factory: Union[None, Callable[[], Any], Dict[str, Callable[[], Any]]]
    args: Any
    tokenizer: Any
    # what each checkpoint records it was trained on (checkpoints.job_inputs)
    record: Dict[str, Any]
    # output_dir holds another run's model, which overwrite_output_dir lets this run write over
    replaces_a_run: bool
    # the evaluate: section's inputs, checked with the run's, or None
    evaluation: Optional[EvaluationInputs]


def _train(algorithm: str, spec: Spec, build: Callable[[Job], Any]) -> None:
    split = parts(spec)
    output_dir = split.resume.output_dir
    fault = FaultInjection.from_env(output_dir)
    strategy = strategy_for(spec.distributed)
    strategy.check_hardware()
    strategy.init_process_group()
    world_size = distributed.world_size()

    reward_check = RewardCheck()
    # rank 0 holds output_dir until the job ends: another run into it stops at its first check
    with contextlib.ExitStack() as held, checkpoints.disk_errors(output_dir):
        # also the barrier: every rank has read the old spec file (resume) by now
        with distributed.all_ranks_agree():
            if distributed.is_rank0():
                held.callback(lease.acquire(output_dir).release)
            inputs = _check_inputs(spec, split, world_size, reward_check)
        # every rank judged the checkpoints (their errors agree above); all resume from rank 0's choice
        resume_from = distributed.rank0s(inputs.resume_from if inputs is not None else None)
        # before a finished run ends: nodes that do not share output_dir would not agree that it finished
        distributed.check_shared_output(output_dir)
        if inputs is None:
            if split.evaluation is not None:
                # its evaluation may be another's, or cut short
                evaluate_run(split.evaluation, output_dir, None)
            return
        if distributed.is_rank0():
            if inputs.replaces_a_run:
                moved = checkpoints.set_aside_previous_run(output_dir)
                log.info("overwrite_output_dir: the model and records of the run %s held are in %s", output_dir, moved)
            write_json_atomic(output_dir / SPEC_FILE, spec.model_dump(mode="json"))

        args, tokenizer = inputs.args, inputs.tokenizer
        tokens, preemption = TokenCounter(), Preemption()
        metrics_log = MetricsLog(output_dir, algorithm, spec.model.name_or_path, world_size)
        # checkpoints sealed, then rotated: the Trainer's own rotation is off (training_arguments)
        sealing = checkpoints.SealCheckpoints(inputs.record, spec.training.get("save_total_limit"))
        callbacks = [tokens, preemption, metrics_log, BestMetricCheck(), sealing]
        callbacks += [fault] if fault is not None else []
        callbacks += [reward_check] if split.rewards else []
        # a progress bar on a terminal (the trainer's own); plain lines in files and pipes, and for our PPO
        lines = args.disable_tqdm
        job = Job(
            split.models,
            split.fast_paths,
            args,
            tokenizer,
            inputs.train_dataset,
            inputs.eval_dataset,
            callbacks=callbacks + [ProgressLog()] * lines,
            rewards=inputs.rewards,
            reward_weights=[reward.weight for reward in split.rewards],
            tools=inputs.tools,
            environment_factory=inputs.environment_factory,
            generation=split.generation,
        )
        trainer = built_trainer(job, build)
        # a run killed in its final save, after its last checkpoint: its end is all that is left to write
        if resume_from is not None and at_last_step(Path(resume_from), args.max_steps):
            log.info(
                "%s is the run's last step, and the run did not end: finishing from it, no step trained", resume_from
            )
            train_no_step(trainer)
        # a generating trainer's prompts are not prepared
        if not spec.generates:
            check_kept_rows(trainer, inputs.train_dataset, inputs.eval_dataset)
        if lines and isinstance(trainer, Trainer):
            # its raw dicts would repeat the lines
            trainer.remove_callback(PrinterCallback)
        # what the model generated, a few rollouts a step (TRL's trainers keep them: known once one is built)
        if spec.generates and isinstance(trainer, Trainer):
            trainer.add_callback(RolloutSamples(trainer, output_dir))
        strategy.check_engine(trainer)

        # launcher.py
        kept = f"; logs kept in {os.environ[KEPT_LOGS]}" if os.environ.get(KEPT_LOGS) else ""
        log.info(
            "training %s on %d process(es); resume from %s%s%s",
            algorithm,
            world_size,
            resume_from or "scratch",
            _turns(args, split.generation),
            kept,
        )
        result = trainer.train(resume_from_checkpoint=resume_from)
        if preemption.stopped:
            log.warning("SIGTERM: saved checkpoint-%d; a restart resumes from it", trainer.state.global_step)
            raise Exit(128 + signal.SIGTERM)
        strategy.prepare_final_save(trainer)
        # saved aside and moved in whole, then the summary: a kill leaves a resumable run, never a finished-looking one
        staging = checkpoints.final_staging(output_dir)
        # rank 0 has cleared a leftover before any rank writes there
        distributed.barrier()
        trainer.save_model(str(staging))
        summary = run_summary(
            algorithm,
            split.resume.spec_record,
            trainer,
            result.metrics,
            resume_from,
            tokens.at_start,
            inputs.record,
            fast_paths.applied(trainer, split.fast_paths),
            spec.generates,
        )
        if trainer.is_world_process_zero():
            # what save_state writes, staged
            trainer.state.save_to_json(str(staging / "trainer_state.json"))
            write_model_card(trainer, output_dir, spec.model.name_or_path)
            checkpoints.publish_final(staging, output_dir, fault.final_file_moved if fault is not None else None)
            # last: the mark of a finished run
            write_json_atomic(output_dir / SUMMARY_FILE, summary)
        strategy.teardown(trainer)
        # while the process group exists: vLLM leaves its groups at shutdown
        vllm_generation.shutdown(trainer)
        # the run's last line: the details are in run_summary.json
        line = closing_line(summary, str(output_dir))
        if split.evaluation is not None:
            preemption.release()
            # the trained model is read back as saved: the trainer's copies go first, and with them ZeRO-3's hold
            # on from_pretrained (it would partition the models the evaluation loads)
            del trainer, job
            unset_hf_deepspeed_config()
            gc.collect()
            torch.cuda.empty_cache()
            evaluate_run(split.evaluation, output_dir, line, inputs.evaluation)
        elif distributed.is_rank0():
            say_closing(line)


def _turns(args: Any, generation: Optional[TrainingGeneration]) -> str:
    """How generation takes turns with training, for the job's first line: where vLLM generates."""
    if not getattr(args, "use_vllm", False):
        return ""
    if generation is not None and generation.runs_ahead:
        return (
            f"; vLLM ({args.vllm_mode}) generates ahead of training, samples at most {generation.max_lag} step(s) old"
        )
    return f"; vLLM ({args.vllm_mode}) generates in lockstep with training"


def _check_inputs(spec: Spec, split: Parts, world_size: int, reward_check: RewardCheck) -> Optional[_Inputs]:
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
    checkpoints.check_room(output_dir, spec.model, saves_checkpoints=args.save_strategy != "no")
    check_model_options(split.models)
    tokenizer = load_tokenizer(spec.model.name_or_path, spec.model, padding_side="left" if spec.generates else "right")
    check_chat_template(args, tokenizer, datasets, spec.model.name_or_path)
    check_reward_templates(rewards, spec.model, datasets)
    if calls:
        check_tool_template(tokenizer, spec.model.name_or_path)
    split_step = fast_paths.micro_batches(
        split.fast_paths,
        torch.cuda.is_available(),
        args,
        lambda: longest_prompt(tokenizer, train_dataset, tools, args.chat_template_kwargs),
    )
    if split_step:
        args = build_config(spec.config_class, training_arguments(spec, {**training, **split_step}))
    eval_dataset = datasets[1][1] if len(datasets) > 1 else None
    return _Inputs(
        train_dataset,
        eval_dataset,
        resume_from,
        rewards,
        tools,
        environment_factory,
        args,
        tokenizer,
        inputs_record,
        split.resume.overwrite and checkpoints.holds_a_run(output_dir),
        evaluation,
    )


def build_config(config_class: str, kwargs: Dict[str, Any]) -> Any:
    """The algorithm's TRL config (``config_class``, "module:Class") from its keyword arguments; its own checks
    (``__post_init__``'s ValueErrors) said as one ``training:`` line."""
    try:
        return import_object(config_class)(**kwargs)
    except SpecError:
        raise
    except ValueError as error:
        # one line: transformers lists what it found on lines of their own ("- Save strategy: ...")
        parts = [line.strip().removeprefix("- ") for line in str(error).splitlines() if line.strip()]
        message = "; ".join(parts) or type(error).__name__
        raise SpecError([f"training: {message if len(message) <= 300 else message[:297] + '...'}"]) from None


def check_environment(args: Any) -> None:
    """What the config needs of the job's environment, before any model loads: the packages ``optim`` and
    ``report_to`` need (looked up as the trainer will), and for ``push_to_hub`` the Hub, reached with the token."""
    import huggingface_hub
    from transformers.integrations import INTEGRATION_TO_CALLBACK, get_available_reporting_integrations

    try:
        # the optimizer's class: its package imported
        Trainer.get_optimizer_cls_and_kwargs(args)
    except (ImportError, ValueError) as error:
        # other ValueErrors need the model (GaLore's target modules)
        if isinstance(error, ImportError) or "install" in str(error):
            raise SpecError([f"training.optim: {args.optim.value}: {first_line(error)}"]) from None
    available = get_available_reporting_integrations()
    for name in [name for name in args.report_to if name not in available]:
        # the callback raises before doing anything when its package is missing
        try:
            INTEGRATION_TO_CALLBACK[name]()
        except (ImportError, RuntimeError) as error:
            raise SpecError([f"training.report_to: {name}: {first_line(error)}"]) from None
    if args.push_to_hub and huggingface_hub.constants.HF_HUB_OFFLINE:
        raise SpecError(
            [
                "training.push_to_hub: HF_HUB_OFFLINE is set in the job's environment; unset it, or drop "
                "push_to_hub and upload output_dir when the run is done"
            ]
        )
    if args.push_to_hub and args.hub_token is None and huggingface_hub.get_token() is None:
        raise SpecError(
            [
                "training.push_to_hub: the job's environment has no Hugging Face token; pass one (--env "
                "HF_TOKEN=...), or log in where the job runs (hf auth login)"
            ]
        )
    # the trainer reaches the Hub from rank 0 alone
    if args.push_to_hub and distributed.is_rank0():
        hub = huggingface_hub.constants.ENDPOINT
        # HfApi.whoami's request has no timeout: where packets are dropped it would wait minutes
        try:
            response = huggingface_hub.utils.get_session().get(
                f"{hub}/api/whoami-v2",
                headers=huggingface_hub.utils.build_hf_headers(token=args.hub_token),
                timeout=huggingface_hub.constants.DEFAULT_REQUEST_TIMEOUT,
            )
            huggingface_hub.utils.hf_raise_for_status(response)
        except Exception as error:
            # no route, a refused token: the Hub client's exceptions vary with its version
            raise SpecError(
                [
                    f"training.push_to_hub: the Hugging Face Hub ({hub}) refused the job's token or cannot be "
                    f"reached from the job: {first_line(error)}"
                ]
            ) from None


def training_arguments(spec: Spec, training: Dict[str, Any]) -> Dict[str, Any]:
    """The TRL config's keyword arguments: the user's plus what the package owns."""
    on_cpu = not torch.cuda.is_available()
    kwargs = dict(training)
    kwargs["use_cpu"] = on_cpu
    # posttrain rotates checkpoints once the newest is sealed (checkpoints.SealCheckpoints); the Trainer would before
    kwargs["save_total_limit"] = None
    kwargs["ddp_timeout"] = spec.distributed.timeout_s
    # accelerate keeps float32 on CPU: no autocast, not a word
    if on_cpu and kwargs.get("fp16"):
        raise SpecError(
            [
                "training.fp16: float16 mixed precision runs on GPUs only; this job runs on CPU, where it "
                "would train in float32: drop it, or use bf16: true"
            ]
        )
    if on_cpu and "bf16" not in kwargs:
        # TRL defaults to bf16 mixed precision, meant for GPUs
        kwargs["bf16"] = False
    offloaded = [
        key for key in CHECKPOINTING_OPTIONS if isinstance(kwargs.get(key), dict) and kwargs[key].get("offload")
    ]
    # transformers would fail in the first step: pinned memory needs an accelerator
    if on_cpu and offloaded:
        raise SpecError(
            [
                f"training.{offloaded[0]}: offload: true moves saved activations off the GPU into "
                "pinned host memory; this job runs on CPU, where they are in host memory already: drop it"
            ]
        )
    kwargs.setdefault("include_num_input_tokens_seen", "non_padding" if spec.batches_hold_input_ids else "no")
    for key, value in spec.config_defaults.items():
        kwargs.setdefault(key, value)
    # a bar on a terminal; lines elsewhere (ProgressLog)
    kwargs.setdefault("disable_tqdm", not sys.stdout.isatty())
    if (
        "ddp_find_unused_parameters" in config_fields(spec.config_class)
        and kwargs.get("ddp_find_unused_parameters") is None
    ):
        config = model_config(spec.model.name_or_path, spec.model)
        # decided by the model
        kwargs["ddp_find_unused_parameters"] = may_leave_parameters_unused(config)
    rewards = getattr(spec, "rewards", [])
    if rewards and "reward_weights" in config_fields(spec.config_class):
        # else the trainer takes them itself
        kwargs["reward_weights"] = [reward.weight for reward in rewards]
    kwargs.update(strategy_for(spec.distributed).trainer_arguments(spec.config_class, kwargs))
    kwargs.update(fast_paths.config_defaults(_fast_path_options(spec), on_cuda=not on_cpu, training=kwargs))
    if kwargs.get("use_vllm"):
        if importlib.util.find_spec("vllm") is None:
            raise SpecError(["training.use_vllm: vLLM is not installed in the job's environment (pip install vllm)"])
        # checks, then adapts TRL's
        kwargs.update(
            vllm_generation.prepare(type(spec), spec.model, kwargs, on_cpu, getattr(spec, "generation", None))
        )
    return kwargs
