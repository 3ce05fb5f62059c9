"""The life of a job, which every algorithm's entrypoint shares.

An entrypoint calls :func:`run` with its algorithm's name (and, only if the
registry names no trainer, a function building its own). :func:`run` does
the rest, in an order that fails early and cheaply:

1. parse and re-validate the spec (``--spec-json``), before importing a model;
2. create the process group with ``distributed.timeout_s`` on every backend
   (with ``use_cpu`` transformers ignores ``ddp_timeout``);
3. load the data and check its columns, fit the batch to its size;
4. resolve ``resume`` (a checkpoint of a different spec is an error);
5. import reward functions, build the TRL config (``use_cpu`` from the
   hardware), the tokenizer and then the trainer with its models;
6. train, then save the unwrapped model, the tokenizer,
   ``trainer_state.json`` and ``run_summary.json`` into ``output_dir``.

Input errors (a missing file, wrong columns, a data set too small) end every
rank with one message and exit code 2; anything else keeps its traceback.

What happens where: ``distributed.py`` (the process group), ``sharding.py``
(DDP, DeepSpeed, FSDP), ``data.py``, ``models.py``, ``rewards.py``,
``checkpoints.py`` (resume), ``summary.py`` (``run_summary.json``).
"""

import argparse
import dataclasses
import importlib.util
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from transformers import PrinterCallback

from posttrain.components.fields import config_fields
from posttrain.components.messages import SpecError
from posttrain.components.schema import Spec
from posttrain.components.spec import spec_from_json
from posttrain.entrypoints import distributed
from posttrain.entrypoints.callbacks import FaultInjection, Preemption, ProgressLog, TokenCounter
from posttrain.entrypoints.checkpoints import SPEC_FILE, already_finished, resolve_resume, write_json_atomic
from posttrain.entrypoints.data import check_online_data, fit_batch, load_data
from posttrain.entrypoints.metrics import MetricsLog
from posttrain.entrypoints.models import import_object, load_extra_model, load_model, load_tokenizer, lora_config
from posttrain.entrypoints.rewards import has_rewards, load_reward_models, resolve_rewards
from posttrain.entrypoints.sharding import strategy_for
from posttrain.entrypoints.summary import SUMMARY_FILE, run_summary

log = logging.getLogger("posttrain")


@dataclasses.dataclass
class Job:
    """What a trainer is built from: the spec, the TRL config, the data, and loaders for the models."""

    spec: Spec
    args: Any  # the algorithm's TRL config instance (SFTConfig, ...)
    tokenizer: Any
    train_dataset: Any
    eval_dataset: Any
    callbacks: List[Any]
    rewards: List[Any]  # reward functions, and reward-model paths that load_rewards loads

    def load_model(self) -> Any:
        """The model to train: ``model.name_or_path`` with the algorithm's ``model_class``."""
        return load_model(self.spec.model.name_or_path, self.spec, self.tokenizer, self.spec.model_class)

    def load_extra_models(self) -> Dict[str, Any]:
        """The algorithm's other models (reference, teacher, value), by the trainer keyword each goes to."""
        extra_models = self.spec.extra_models.items()
        return {kwarg: load_extra_model(field, self.spec, self.tokenizer) for field, kwarg in extra_models}

    def load_rewards(self) -> Tuple[List[Any], List[Optional[Any]]]:
        """``(reward_funcs, reward_processing_classes)`` with the reward models loaded."""
        return load_reward_models(self.rewards, self.spec)

    @property
    def trainer_kwargs(self) -> Dict[str, Any]:
        """What every TRL trainer takes besides its model(s)."""
        return {
            "args": self.args,
            "train_dataset": self.train_dataset,
            "eval_dataset": self.eval_dataset,
            "processing_class": self.tokenizer,
            "peft_config": lora_config(self.spec),
            "callbacks": self.callbacks,
        }


def registry_trainer(job: Job) -> Any:
    """The registry's trainer with the model, the extra models, the rewards where the spec has them, and the rest."""
    spec = job.spec
    if spec.trainer_class is None:
        raise TypeError(f"{spec.algorithm}: the registry names no trainer; its entrypoint passes build_trainer to run")
    trainer_class = import_object(spec.trainer_class)
    models = {"model": job.load_model(), **job.load_extra_models()}
    if has_rewards(spec):
        models["reward_funcs"], models["reward_processing_classes"] = job.load_rewards()
    return trainer_class(**models, **job.trainer_kwargs)


def run(
    algorithm: str, build_trainer: Optional[Callable[[Job], Any]] = None, argv: Optional[Sequence[str]] = None
) -> None:
    """Runs one training job: the whole life of an entrypoint.

    ``build_trainer`` builds the trainer from the :class:`Job`; by default
    :func:`registry_trainer`, for every algorithm whose spec class names a trainer.
    """
    parser = argparse.ArgumentParser(prog=f"python -m posttrain.entrypoints.{algorithm}")
    parser.add_argument("--spec-json", required=True, help="the validated spec, as the component embedded it")
    options = parser.parse_args(argv)
    distributed.setup_logging()
    try:
        spec = spec_from_json(options.spec_json)
        if spec.algorithm != algorithm:
            raise SpecError([f"algorithm: the spec is for {spec.algorithm!r}, this entrypoint runs {algorithm!r}"])
        _train(algorithm, spec, build_trainer or registry_trainer)
    except SpecError as error:
        print(f"posttrain: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    finally:
        distributed.destroy_process_group()
    distributed.report_done()


def _train(algorithm: str, spec: Spec, build: Callable[[Job], Any]) -> None:
    output_dir = Path(spec.training["output_dir"])
    fault = FaultInjection.from_env(output_dir)
    strategy = strategy_for(spec.distributed)
    strategy.check_hardware()
    strategy.init_process_group()
    world_size = distributed.world_size()

    train_dataset = load_data(spec.data.train, spec.data.columns, "data.train", spec.data_formats)
    eval_dataset = None
    if spec.data.eval is not None:
        eval_dataset = load_data(spec.data.eval, spec.data.columns, "data.eval", spec.data_formats)
    # a generating algorithm's batch is tied to num_generations or mini-batches: checked, never shrunk
    training = dict(spec.training) if spec.generates else fit_batch(
        spec.training, spec.config_class, len(train_dataset), world_size
    )
    resume_from = resolve_resume(spec, output_dir)
    if resume_from is not None and already_finished(output_dir, Path(resume_from), training.get("max_steps", -1)):
        log.info("%s already holds this run, finished at %s: nothing to train", output_dir, resume_from)
        return
    distributed.barrier()  # every rank has read the old spec file before rank 0 replaces it
    if distributed.is_rank0():
        output_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(output_dir / SPEC_FILE, spec.model_dump(mode="json"))
    distributed.check_shared_output(output_dir)

    rewards = resolve_rewards(spec)
    args = import_object(spec.config_class)(**training_arguments(spec, training))
    check_online_data(type(spec), args, len(train_dataset), world_size)
    tokenizer = load_tokenizer(spec.model.name_or_path, spec, padding_side="left" if spec.generates else "right")
    tokens, preemption = TokenCounter(), Preemption()
    metrics_log = MetricsLog(output_dir, algorithm, spec.model.name_or_path, world_size)
    callbacks = [tokens, preemption, metrics_log] + ([fault] if fault is not None else [])
    # a progress bar on a terminal (the trainer's own); plain lines in files and pipes, and for our PPO
    lines = args.disable_tqdm or spec.trainer_class is None
    job = Job(spec, args, tokenizer, train_dataset, eval_dataset, callbacks=callbacks + [ProgressLog()] * lines,
              rewards=rewards)  # fmt: skip
    trainer = build(job)
    if lines and spec.trainer_class is not None:
        trainer.remove_callback(PrinterCallback)  # its raw dicts would repeat the lines
    strategy.check_engine(trainer)

    log.info("training %s on %d process(es); resume from %s", algorithm, world_size, resume_from or "scratch")
    result = trainer.train(resume_from_checkpoint=resume_from)
    if preemption.stopped:
        log.warning("SIGTERM: saved checkpoint-%d; a restart resumes from it", trainer.state.global_step)
        raise SystemExit(128 + signal.SIGTERM)
    strategy.prepare_final_save(trainer)
    trainer.save_model(str(output_dir))
    trainer.save_state()
    summary = run_summary(algorithm, spec, trainer, result.metrics, resume_from, tokens)
    if trainer.is_world_process_zero():
        write_json_atomic(output_dir / SUMMARY_FILE, summary)
        log.info("done: %s", json.dumps({k: summary[k] for k in ("global_steps", "metrics_first", "metrics_last")}))
    strategy.teardown(trainer)


def training_arguments(spec: Spec, training: Dict[str, Any]) -> Dict[str, Any]:
    """The TRL config's keyword arguments: the user's plus what the package owns."""
    on_cpu = not torch.cuda.is_available()
    kwargs = dict(training)
    kwargs["use_cpu"] = on_cpu
    kwargs["ddp_timeout"] = spec.distributed.timeout_s
    if on_cpu and "bf16" not in kwargs and not kwargs.get("fp16"):
        kwargs["bf16"] = False  # TRL defaults to bf16 mixed precision, meant for GPUs
    kwargs.setdefault("include_num_input_tokens_seen", "non_padding")
    kwargs.setdefault("disable_tqdm", not sys.stdout.isatty())  # a bar on a terminal; lines elsewhere (ProgressLog)
    if has_rewards(spec) and "reward_weights" in config_fields(spec.config_class):
        kwargs["reward_weights"] = [reward.weight for reward in spec.rewards]  # else the trainer takes them itself
    kwargs.update(strategy_for(spec.distributed).trainer_arguments(spec.config_class, kwargs))
    if kwargs.get("use_vllm") and importlib.util.find_spec("vllm") is None:
        raise SpecError(["training.use_vllm: vLLM is not installed in the job's environment (pip install vllm)"])
    return kwargs
