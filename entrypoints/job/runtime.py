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

The spec is read once, at the start (``spec_parts.py``): each step is handed its
part (how models load, the fast paths' options, what resume is decided from,
the rewards), as ``sharding.Strategy`` is handed ``distributed``; only the
steps that split it see the whole spec.

The story's chapters, each in a module named for it: ``checks.py`` (the
inputs, before any model loads), ``config.py`` (the trainer's config), this
module (load, train, publish, evaluate), ``process/ending.py`` (the one line
a job ends in). Beside them: ``process/distributed.py`` (the process group),
``sharding.py`` (DDP, DeepSpeed, FSDP), ``inputs/`` (data, models, rewards),
``process/lease.py`` (one run per ``output_dir``), ``records/checkpoints.py``
(resume), ``records/summary.py`` (``run_summary.json``),
``speed/fast_paths.py``.
"""

import argparse
import contextlib
import dataclasses
import gc
import logging
import os
import signal
from pathlib import Path
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple, Union

import torch
from transformers import PrinterCallback, Trainer
from transformers.integrations.deepspeed import unset_hf_deepspeed_config

from posttrain.components.spec.generation import TrainingGeneration
from posttrain.components.spec.loading import spec_from_json
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.schema import Spec
from posttrain.entrypoints.evaluation.run import evaluate_run
from posttrain.entrypoints.generation import role_lease, run_ahead, turns, vllm_generation, vllm_token
from posttrain.entrypoints.generation.agent_rollouts import AgentRollouts
from posttrain.entrypoints.inputs.models import ModelLoading, load_extra_model, load_model, lora_config
from posttrain.entrypoints.inputs.prepared import check_kept_rows
from posttrain.entrypoints.inputs.rewards import RewardCheck, load_reward_models
from posttrain.entrypoints.job.callbacks import BestMetricCheck, FaultInjection, Preemption, ProgressLog, TokenCounter
from posttrain.entrypoints.job.checks import check_inputs
from posttrain.entrypoints.job.sharding import strategy_for
from posttrain.entrypoints.job.spec_parts import parts
from posttrain.entrypoints.process import distributed, lease
from posttrain.entrypoints.process.ending import ends_in_one_line, quiet_libraries
from posttrain.entrypoints.process.error_file import KEPT_LOGS, Exit, report_done
from posttrain.entrypoints.records import checkpoints, disk, final_model
from posttrain.entrypoints.records.checkpoints import SPEC_FILE
from posttrain.entrypoints.records.files import write_json_atomic
from posttrain.entrypoints.records.final_model import at_last_step
from posttrain.entrypoints.records.metrics import MetricsLog
from posttrain.entrypoints.records.samples import RolloutSamples
from posttrain.entrypoints.records.summary import SUMMARY_FILE, closing_line, run_summary, say_closing, write_model_card
from posttrain.entrypoints.speed import fast_paths
from posttrain.entrypoints.speed.fast_paths import FastPathOptions

log = logging.getLogger("posttrain")


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
    # GRPO's rollout_func where an agent program plays the rollouts, or None
    rollouts: Optional[AgentRollouts] = None

    def load_model(self) -> Any:
        """The model to train: ``model.name_or_path`` with the algorithm's ``model_class``, quantized where
        ``model.quantization`` says."""
        return load_model(self.models.name_or_path, self.models, self.tokenizer, self.models.model_class, trained=True)

    def load_extra_model(self, field: str) -> Any:
        """The model the spec field ``field`` names (``reference_model``, ``teacher_model``, ``value_model``), loaded
        with the tokenizer checked against the policy's; None where there is none (a reference under LoRA)."""
        return load_extra_model(field, self.models, self.tokenizer)

    def load_rewards(self) -> Tuple[List[Any], List[Optional[Any]]]:
        """``(reward_funcs, reward_processing_classes)`` with the reward models loaded; an agent program's reward
        last."""
        funcs, classes = load_reward_models(self.rewards, self.models)
        if self.rollouts is None:
            return funcs, classes
        return [*funcs, self.rollouts.reward()], [*classes, None]

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
    report_done()


def main(algorithm: str, build_trainer: Callable[[Job], Any]) -> NoReturn:
    """An entrypoint's process: :func:`run`, then the process ends as soon as its work is done
    (``distributed.end_process``)."""
    distributed.exit_after(lambda: run(algorithm, build_trainer))


def built_trainer(job: Job, build_trainer: Callable[[Job], Any]) -> Any:
    """The entrypoint's trainer, its passes over generated completions padding-free where they can be
    (GRPO's, RLOO's: fast_paths.switch_passes_to_padding_free, their rollouts by the rollout generator), its vLLM
    generation bounded in time and taking turns with the vllm role (run_ahead)."""
    trainer = build_trainer(job)
    if job.rollouts is not None:
        job.rollouts.attach(trainer)
    if job.fast_paths.rl_passes:
        fast_paths.switch_passes_to_padding_free(trainer, job.generation is None or job.generation.rollout_generator)
    args = getattr(trainer, "args", None)
    if job.generation is not None and getattr(args, "use_vllm", False):
        # a generation that never ends is one line naming the engine and the step
        turns.bound_generation(trainer, job.generation)
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
    with contextlib.ExitStack() as held, disk.disk_errors(output_dir):
        # also the barrier: every rank has read the old spec file (resume) by now
        with distributed.all_ranks_agree():
            if distributed.is_rank0():
                held.callback(lease.acquire(output_dir).release)
            inputs = check_inputs(spec, split, world_size, reward_check)
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
        if inputs.agent is not None:
            assert split.agent is not None
            job.rollouts = AgentRollouts(inputs.agent, split.agent.scorer_name(), spec.model.name_or_path)
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
        staging = final_model.final_staging(output_dir)
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
            final_model.publish_final(staging, output_dir, fault.final_file_moved if fault is not None else None)
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
