"""The job-side runtime every algorithm's entrypoint shares.

An entrypoint only builds its trainer; :func:`run` does the rest, in an
order that fails early and cheaply:

1. parse and re-validate the spec (``--spec-json``), before importing a model;
2. create the process group with ``distributed.timeout_s`` on every backend
   (with ``use_cpu`` transformers ignores ``ddp_timeout``);
3. load the data and check its columns, fit the batch to its size;
4. resolve ``resume`` (a checkpoint of a different spec is an error);
5. build the TRL config (``use_cpu`` from the hardware), the tokenizer and,
   inside the entrypoint's builder, the model and trainer;
6. train, then save the unwrapped model, the tokenizer,
   ``trainer_state.json`` and ``run_summary.json`` into ``output_dir``.

Input errors (a missing file, wrong columns, a data set too small) end every
rank with one message and exit code 2; anything else keeps its traceback.
"""

import argparse
import dataclasses
import importlib
import importlib.util
import json
import logging
import os
import re
import signal
import statistics
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type

import torch
import torch.distributed as dist

from posttrain.components.fields import CONFIG_CLASSES, config_value
from posttrain.components.spec import (
    NOT_TRAINING_RELEVANT,
    DataSource,
    DistributedSpec,
    FSDPSpec,
    Spec,
    SpecError,
    spec_diff,
    spec_from_json,
)
from posttrain.entrypoints.callbacks import FaultInjection, Preemption, TokenCounter, collective_device
from posttrain.entrypoints.deepspeed_launcher import DONE_DIR_ENV

log = logging.getLogger("posttrain")

SPEC_FILE = "posttrain_spec.json"
SUMMARY_FILE = "run_summary.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")

# Column sets each algorithm accepts (any one of them), after data.columns renames.
PREFERENCE_FORMATS = (("prompt", "chosen", "rejected"), ("chosen", "rejected"))
DATA_FORMATS: Dict[str, Tuple[Tuple[str, ...], ...]] = {
    "sft": (("messages",), ("text",), ("prompt", "completion")),
    "dpo": PREFERENCE_FORMATS,
    "reward": PREFERENCE_FORMATS,
    "orpo": PREFERENCE_FORMATS,
    "kto": (("prompt", "completion", "label"),),
    "grpo": (("prompt",),),
    "rloo": (("prompt",),),
    "ppo": (("prompt",),),
}

# Algorithms that generate completions: prompts are padded on the left.
ONLINE = ("grpo", "rloo", "ppo")
# Those among them that compare num_generations completions of each prompt.
GROUP = ("grpo", "rloo")

# PEFT task of each algorithm's model, where not a causal LM.
LORA_TASKS = {"reward": "SEQ_CLS"}


@dataclasses.dataclass
class Job:
    """What an entrypoint builds its trainer from."""

    spec: Spec
    args: Any  # the algorithm's TRL config instance (SFTConfig, ...)
    tokenizer: Any
    train_dataset: Any
    eval_dataset: Any
    callbacks: List[Any]
    rewards: List[Any]  # TRL reward functions: callables, or reward-model paths

    def load_model(self, model_class: Optional[Type] = None) -> Any:
        """Loads ``model.name_or_path`` (a path, a hub id or builtin:tiny-llama)."""
        from transformers import AutoModelForCausalLM

        return load_model(self.spec.model.name_or_path, self.spec, self.tokenizer, model_class or AutoModelForCausalLM)

    def load_reference_model(self) -> Any:
        """The frozen reference policy: ``reference_model``, else a fresh load of the policy.

        With LoRA it is None: the trainer disables the adapter instead.
        """
        from transformers import AutoModelForCausalLM

        if self.spec.model.lora is not None:
            return None
        name = getattr(self.spec, "reference_model", None) or self.spec.model.name_or_path
        return load_model(name, self.spec, self.tokenizer, AutoModelForCausalLM)

    @property
    def trainer_kwargs(self) -> Dict[str, Any]:
        """What every TRL trainer takes besides its model(s)."""
        return {
            "args": self.args,
            "train_dataset": self.train_dataset,
            "eval_dataset": self.eval_dataset,
            "processing_class": self.tokenizer,
            "peft_config": self.peft_config,
            "callbacks": self.callbacks,
        }

    @property
    def peft_config(self) -> Any:
        """PEFT's LoraConfig from ``model.lora``, or None."""
        if self.spec.model.lora is None:
            return None
        from peft import LoraConfig

        task = LORA_TASKS.get(self.spec.algorithm, "CAUSAL_LM")
        return LoraConfig(**{"task_type": task, **self.spec.model.lora})


def run(algorithm: str, build_trainer: Callable[[Job], Any], argv: Optional[Sequence[str]] = None) -> None:
    """Runs one training job: the whole life of an entrypoint."""
    parser = argparse.ArgumentParser(prog=f"python -m posttrain.entrypoints.{algorithm}")
    parser.add_argument("--spec-json", required=True, help="the validated spec, as the component embedded it")
    options = parser.parse_args(argv)
    _setup_logging()
    try:
        spec = spec_from_json(options.spec_json)
        if spec.algorithm != algorithm:
            raise SpecError([f"algorithm: the spec is for {spec.algorithm!r}, this entrypoint runs {algorithm!r}"])
        _train(algorithm, spec, build_trainer)
    except SpecError as error:
        print(f"posttrain: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    finally:
        _teardown()
    _report_done()


def _train(algorithm: str, spec: Spec, build_trainer: Callable[[Job], Any]) -> None:
    output_dir = Path(spec.training["output_dir"])
    fault = FaultInjection.from_env(output_dir)
    if spec.distributed.fsdp is not None and not torch.cuda.is_available():
        raise SpecError(
            [
                "distributed.fsdp: this job sees no GPU, and accelerate runs FSDP on GPUs only (on CPU it trains "
                "plain DDP instead); run on GPUs, or shard on CPU with distributed.deepspeed"
            ]
        )
    init_distributed(spec.distributed)
    world_size = dist.get_world_size() if dist.is_initialized() else 1

    train_dataset = load_data(spec.data.train, spec.data.columns, "data.train", DATA_FORMATS[algorithm])
    eval_dataset = None
    if spec.data.eval is not None:
        eval_dataset = load_data(spec.data.eval, spec.data.columns, "data.eval", DATA_FORMATS[algorithm])
    # an online batch is tied to num_generations or mini-batches: checked, never shrunk
    training = dict(spec.training) if algorithm in ONLINE else fit_batch(
        spec.training, spec.config_class, len(train_dataset), world_size
    )
    resume_from = resolve_resume(spec, output_dir)
    if resume_from is not None and already_finished(output_dir, Path(resume_from), training.get("max_steps", -1)):
        log.info("%s already holds this run, finished at %s: nothing to train", output_dir, resume_from)
        return
    _barrier()  # every rank has read the old spec file before rank 0 replaces it
    if _is_rank0():
        output_dir.mkdir(parents=True, exist_ok=True)
        _write_json_atomic(output_dir / SPEC_FILE, spec.model_dump(mode="json"))
    check_shared_output(output_dir)

    rewards = resolve_rewards(spec)
    args = _config_class(spec.config_class)(**training_arguments(spec, training))
    check_online_data(algorithm, args, len(train_dataset), world_size)
    tokenizer = load_tokenizer(spec, padding_side="left" if algorithm in ONLINE else "right")
    tokens, preemption = TokenCounter(), Preemption()
    callbacks = [tokens, preemption] + ([fault] if fault is not None else [])
    job = Job(spec, args, tokenizer, train_dataset, eval_dataset, callbacks=callbacks, rewards=rewards)
    trainer = build_trainer(job)
    strategy = check_engine(spec, trainer)

    log.info("training %s on %d process(es); resume from %s", algorithm, world_size, resume_from or "scratch")
    result = trainer.train(resume_from_checkpoint=resume_from)
    if preemption.stopped:
        log.warning("SIGTERM: saved checkpoint-%d; a restart resumes from it", trainer.state.global_step)
        raise SystemExit(128 + signal.SIGTERM)
    if strategy == "fsdp":
        # checkpoints stay sharded (each rank writes its part); the final model is one from_pretrained directory
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    trainer.save_model(str(output_dir))
    trainer.save_state()
    summary = run_summary(algorithm, spec, trainer, result.metrics, resume_from, tokens)
    if trainer.is_world_process_zero():
        _write_json_atomic(output_dir / SUMMARY_FILE, summary)
        log.info("done: %s", json.dumps({k: summary[k] for k in ("global_steps", "metrics_first", "metrics_last")}))
    # every rank finishes before any tears down: a rank leaving while others still write aborted
    # ZeRO-3 runs at exit ("terminate called without an active exception", 1 run in 20 here)
    _barrier()
    if strategy == "deepspeed":
        trainer.model_wrapped.destroy()  # the engine goes before the process group
        _barrier()


# ---------------------------------------------------------------- distributed


def init_distributed(distributed: DistributedSpec) -> None:
    """Creates the process group with ``distributed.timeout_s`` (launched by torchrun or DeepSpeed).

    With DeepSpeed its communication layer adopts the same group, before the
    training arguments exist (ZeRO-3 partitions the model as it loads). FSDP
    on GPUs also gets gloo for CPU tensors (offload, the gathered final
    save), as accelerate gives it when it creates the group itself.
    """
    if "WORLD_SIZE" not in os.environ or dist.is_initialized():
        return
    # the DeepSpeed launcher says LOCAL_SIZE where torchrun says LOCAL_WORLD_SIZE (accelerate reads the latter)
    if "LOCAL_SIZE" in os.environ:
        os.environ.setdefault("LOCAL_WORLD_SIZE", os.environ["LOCAL_SIZE"])
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=distributed.timeout_s)
    # torchrun's agent store outlives a worker restart: without a prefix per attempt, restarted
    # workers read the dead workers' addresses and fail to connect (seen with gloo, torch 2.13).
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
        is_master=not agent_store and rank == 0, timeout=timeout, multi_tenant=not agent_store,
    )  # fmt: skip
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefixed = dist.PrefixStore(f"posttrain/attempt_{attempt}", store)
    group_backend = "cuda:nccl,cpu:gloo" if backend == "nccl" and distributed.fsdp is not None else backend
    dist.init_process_group(backend=group_backend, store=prefixed, rank=rank, world_size=world_size, timeout=timeout)
    if distributed.deepspeed is not None:
        _import_deepspeed().init_distributed(dist_backend=backend, timeout=timeout)


def _import_deepspeed() -> Any:
    """DeepSpeed, or a clear error: a run that asked for it never falls back to DDP."""
    try:
        import deepspeed
    except ImportError as error:
        raise SpecError([f"distributed.deepspeed: DeepSpeed cannot be imported in the job: {error}"]) from None
    return deepspeed


def check_shared_output(output_dir: Path) -> None:
    """With several nodes, every node must see ``output_dir``: rank 0 alone writes what all read.

    Rank 0 writes a fresh token there; the first process of every node reads
    it back. A node that cannot is on other storage, and resume or the final
    save would silently split across nodes.
    """
    if not dist.is_initialized():
        return
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    if dist.get_world_size() // local_world_size <= 1:
        return
    marker = output_dir / ".posttrain_shared_check"
    token = [os.urandom(8).hex() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(token, src=0)
    if dist.get_rank() == 0:
        marker.write_text(token[0])
    dist.barrier()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    sees = local_rank != 0 or (marker.is_file() and marker.read_text() == token[0])
    missing = torch.tensor([0.0 if sees else 1.0], device=collective_device())
    dist.all_reduce(missing)
    dist.barrier()
    if dist.get_rank() == 0:
        marker.unlink(missing_ok=True)
    if missing.item() > 0:
        raise SpecError(
            [
                f"training.output_dir: {output_dir} is not on storage every node sees ({int(missing.item())} "
                "node(s) cannot read what rank 0 wrote); use a shared filesystem (NFS, Lustre, a ReadWriteMany "
                "volume) for multi-node jobs"
            ]
        )


def _is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _report_done() -> None:
    """Tells posttrain's DeepSpeed launcher that this rank finished (its runner's exit status cannot)."""
    done_dir = os.environ.get(DONE_DIR_ENV)
    if done_dir:
        (Path(done_dir) / f"rank-{os.environ.get('RANK', '0')}").touch()


def _setup_logging() -> None:
    """Rank 0 speaks; the others only warn. Only posttrain's own logger: libraries keep theirs."""
    rank = int(os.environ.get("RANK", "0"))
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s posttrain[{rank}] %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    log.propagate = False


# ---------------------------------------------------------------- data


def load_data(
    source: DataSource, columns: Dict[str, str], where: str, formats: Sequence[Tuple[str, ...]]
) -> Any:
    """Loads a local file or hub data set, renames columns and checks them."""
    import datasets

    datasets.disable_progress_bars()
    if source.path is not None:
        path = Path(source.path)
        if not path.is_file():
            raise SpecError([f"{where}.path: no such file: {path} (relative paths start at {Path.cwd()})"])
        builder = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}.get(path.suffix)
        if builder is None:
            raise SpecError([f"{where}.path: {path}: expected a .json, .jsonl, .parquet or .csv file"])
        try:
            dataset = datasets.load_dataset(builder, data_files=str(path), split="train")
        except Exception as error:  # noqa: BLE001 -- any parse failure is the user's file
            raise SpecError([f"{where}.path: cannot read {path}: {error}"]) from None
    else:
        dataset = datasets.load_dataset(source.name, source.config, split=source.split)
    renames = {found: expected for found, expected in columns.items() if found in dataset.column_names}
    missing = sorted(set(columns) - set(renames))
    if missing:
        raise SpecError([f"data.columns: {where} has no column {', '.join(missing)}; found {dataset.column_names}"])
    dataset = dataset.rename_columns(renames)
    if not any(set(cols) <= set(dataset.column_names) for cols in formats):
        expected = " or ".join("(" + ", ".join(cols) + ")" for cols in formats)
        raise SpecError(
            [f"{where}: found columns {dataset.column_names}; expected {expected} (map names with data.columns)"]
        )
    if len(dataset) == 0:
        raise SpecError([f"{where}: the data set is empty"])
    return dataset


def fit_batch(training: Dict[str, Any], config_class: str, rows: int, world_size: int) -> Dict[str, Any]:
    """Shrinks the per-device batch (then accumulation) so one global batch fits the data.

    ``world × per_device × accumulation`` rows larger than the data set make
    an empty data loader, which hangs distributed training.
    """
    per_device = config_value(config_class, training, "per_device_train_batch_size")
    accumulation = config_value(config_class, training, "gradient_accumulation_steps")
    if world_size * per_device * accumulation <= rows:
        return dict(training)
    if world_size > rows:
        raise SpecError(
            [f"data.train: {rows} rows cannot give each of the {world_size} processes one example; use more data"]
        )
    new_per_device = max(1, rows // (world_size * accumulation))
    new_accumulation = min(accumulation, max(1, rows // (world_size * new_per_device)))
    log.warning(
        "data.train has %d rows, fewer than one global batch (%d processes x %d per device x %d accumulation): "
        "using per_device_train_batch_size=%d, gradient_accumulation_steps=%d",
        rows, world_size, per_device, accumulation, new_per_device, new_accumulation,
    )  # fmt: skip
    return {
        **training,
        "per_device_train_batch_size": new_per_device,
        "gradient_accumulation_steps": new_accumulation,
    }


# ---------------------------------------------------------------- model


def training_arguments(spec: Spec, training: Dict[str, Any]) -> Dict[str, Any]:
    """The TRL config's keyword arguments: the user's plus what the package owns."""
    on_cpu = not torch.cuda.is_available()
    kwargs = dict(training)
    kwargs["use_cpu"] = on_cpu
    kwargs["ddp_timeout"] = spec.distributed.timeout_s
    if on_cpu and "bf16" not in kwargs and not kwargs.get("fp16"):
        kwargs["bf16"] = False  # TRL defaults to bf16 mixed precision, meant for GPUs
    kwargs.setdefault("include_num_input_tokens_seen", "non_padding")
    if spec.algorithm in GROUP:
        kwargs["reward_weights"] = [reward.weight for reward in spec.rewards]
    if spec.distributed.deepspeed is not None:
        kwargs["deepspeed"] = deepspeed_config(spec.distributed.deepspeed)
    if spec.distributed.fsdp is not None:
        kwargs.update(fsdp_arguments(spec.distributed.fsdp, spec.config_class, kwargs))
    if kwargs.get("use_vllm") and importlib.util.find_spec("vllm") is None:
        raise SpecError(["training.use_vllm: vLLM is not installed in the job's environment (pip install vllm)"])
    return kwargs


def deepspeed_config(ds: Any) -> Any:
    """The DeepSpeed config the HF integration takes: the user's file, or one for the ZeRO stage.

    ``"auto"`` values are filled in by transformers from the training
    arguments (batch sizes, accumulation, clipping, precision).
    """
    if ds.config is not None:
        if not Path(ds.config).is_file():
            raise SpecError([f"distributed.deepspeed.config: no such file: {ds.config}"])
        return ds.config
    zero: Dict[str, Any] = {"stage": ds.zero_stage}
    pin = torch.cuda.is_available()
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if ds.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    if ds.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True  # save a plain from_pretrained model
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
    }


def fsdp_arguments(fsdp: FSDPSpec, config_class: str, training: Dict[str, Any]) -> Dict[str, Any]:
    """The training arguments that turn on FSDP2 through the HF integration.

    Checkpoints are sharded: each rank writes its own part, and a resume
    needs the same number of processes. Activation checkpointing (the
    trainer's, on by default in TRL) moves to FSDP's wrapper of the layers:
    transformers' advice, it saves an all-gather per layer in the backward.
    """
    checkpointing = training.get("activation_checkpointing")
    if checkpointing is None:
        checkpointing = config_value(config_class, training, "gradient_checkpointing")
    fsdp_config: Dict[str, Any] = {
        "version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "reshard_after_forward": fsdp.reshard_after_forward,
        "cpu_offload": fsdp.cpu_offload,
        "state_dict_type": "SHARDED_STATE_DICT",
        "activation_checkpointing": bool(checkpointing),
    }
    if fsdp.wrap_layers is not None:
        fsdp_config["transformer_layer_cls_to_wrap"] = list(fsdp.wrap_layers)
    return {
        "fsdp": True,
        "fsdp_config": fsdp_config,
        "activation_checkpointing": False,
        "gradient_checkpointing": False,
    }


def check_online_data(algorithm: str, args: Any, rows: int, world_size: int) -> None:
    """Enough prompts for one batch: GRPO/RLOO's generation batch, PPO's rollout of every rank."""
    if algorithm in GROUP:
        needed = args.generation_batch_size // args.num_generations
        how = f"{args.generation_batch_size} completions / {args.num_generations} per prompt"
    elif algorithm == "ppo":
        needed = args.per_device_train_batch_size * world_size
        how = f"{args.per_device_train_batch_size} per process x {world_size} processes"
    else:
        return
    if rows < needed:
        raise SpecError(
            [
                f"data.train: {rows} prompts, fewer than one batch takes ({how} = {needed}); use more prompts, "
                "or lower per_device_train_batch_size or the number of processes"
            ]
        )


def resolve_rewards(spec: Spec) -> List[Any]:
    """The spec's rewards as TRL takes them, importing user code now, before any model loads."""
    from posttrain.entrypoints.rewards import builtin_reward

    resolved: List[Any] = []
    for index, reward in enumerate(getattr(spec, "rewards", [])):
        where = f"rewards.{index}"
        if reward.builtin is not None:
            resolved.append(builtin_reward(reward.builtin, reward.args))
        elif reward.function is not None:
            module_name, _, attr = reward.function.partition(":")
            try:
                function = getattr(importlib.import_module(module_name), attr)
            except (ImportError, AttributeError) as error:
                raise SpecError(
                    [f"{where}.function: cannot import {reward.function} from {Path.cwd()}: {error}"]
                ) from None
            if not callable(function):
                raise SpecError([f"{where}.function: {reward.function} is not callable"])
            resolved.append(function)
        else:
            _check_model_path(reward.model, f"{where}.model")
            resolved.append(reward.model)
    return resolved


def _config_class(name: str) -> type:
    module, _, attr = CONFIG_CLASSES[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def load_tokenizer(spec: Spec, padding_side: str) -> Any:
    """The tokenizer of ``model.name_or_path``, padding on ``padding_side``.

    transformers 5 does not save ``padding_side`` with a tokenizer, so it is
    set after loading; a missing pad token falls back to EOS.
    """
    from transformers import AutoTokenizer

    from posttrain.entrypoints import tiny

    model = spec.model
    if model.name_or_path == tiny.NAME:
        tokenizer = tiny.build_tokenizer()
    else:
        tokenizer = _from_pretrained(
            AutoTokenizer, model.name_or_path, revision=model.revision, trust_remote_code=model.trust_remote_code
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


def load_model(name_or_path: str, spec: Spec, tokenizer: Any, model_class: Type) -> Any:
    """Loads a model with the auto class given (causal LM, sequence classification, ...).

    ``spec.model`` gives the dtype, revision and loading options.
    """
    from posttrain.entrypoints import tiny

    model = spec.model
    scores = "SequenceClassification" in model_class.__name__  # a reward model: one score per sequence
    if name_or_path == tiny.NAME:
        from transformers import LlamaForCausalLM, LlamaForSequenceClassification

        built = tiny.build_model(tokenizer, LlamaForSequenceClassification if scores else LlamaForCausalLM)
        return built.to(getattr(torch, model.dtype)) if model.dtype != "auto" else built
    kwargs: Dict[str, Any] = {
        "revision": model.revision,
        "trust_remote_code": model.trust_remote_code,
        "dtype": model.dtype,
    }
    if model.attn_implementation is not None:
        kwargs["attn_implementation"] = model.attn_implementation
    if scores:
        kwargs["num_labels"] = 1
    loaded = _from_pretrained(model_class, name_or_path, **kwargs)
    if getattr(loaded.config, "pad_token_id", None) is None:
        loaded.config.pad_token_id = tokenizer.pad_token_id
    return loaded


def _from_pretrained(auto_class: Type, name_or_path: str, **kwargs: Any) -> Any:
    """``auto_class.from_pretrained``, a missing directory or unreachable hub id named plainly."""
    _check_model_path(name_or_path)
    try:
        return auto_class.from_pretrained(name_or_path, **kwargs)
    except OSError as error:
        raise SpecError([f"model: cannot load {name_or_path!r}: {error}"]) from None


def _check_model_path(name_or_path: str, where: str = "model.name_or_path") -> None:
    """A path-like name that does not exist is a mistake, not a hub id."""
    if name_or_path.startswith(("/", "./", "../", "~")) and not Path(name_or_path).expanduser().exists():
        raise SpecError([f"{where}: no such directory: {name_or_path}"])


# ---------------------------------------------------------------- resume


def complete_checkpoints(output_dir: Path) -> List[Path]:
    """Checkpoints whose save finished, oldest first.

    The Trainer writes ``trainer_state.json`` last: a checkpoint without a
    readable one was interrupted mid-save and is never resumed from.
    """
    if not output_dir.is_dir():
        return []
    found = []
    for child in output_dir.iterdir():
        match = _CHECKPOINT.match(child.name)
        if match and child.is_dir() and _readable_state(child / "trainer_state.json"):
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def _readable_state(path: Path) -> bool:
    try:
        return "global_step" in json.loads(path.read_text())
    except (OSError, ValueError):
        return False


def resolve_resume(spec: Spec, output_dir: Path) -> Optional[str]:
    """The checkpoint to resume from per ``resume``, or None to start fresh."""
    checkpoints = complete_checkpoints(output_dir)
    if spec.resume == "never":
        if checkpoints:
            raise SpecError(
                [
                    f"resume: never, but {output_dir} already holds checkpoints ({checkpoints[-1].name}); "
                    "use another training.output_dir or remove them, so a later resume cannot mix two runs"
                ]
            )
        return None
    if spec.resume != "auto":
        path = Path(spec.resume)
        if not _readable_state(path / "trainer_state.json"):
            raise SpecError([f"resume: {path} is not a complete checkpoint (no readable trainer_state.json)"])
        return str(path)
    if not checkpoints:
        return None
    saved_path = output_dir / SPEC_FILE
    if not saved_path.is_file():
        raise SpecError(
            [f"resume: auto found {checkpoints[-1]} but no {SPEC_FILE} saying what spec wrote it; set resume to that path"]
        )
    saved = json.loads(saved_path.read_text())
    current = spec.model_dump(mode="json")
    differences = [d for d in spec_diff(saved, current) if d[0] not in NOT_TRAINING_RELEVANT]
    if differences:
        shown = "; ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in differences)
        raise SpecError(
            [
                f"resume: auto found {checkpoints[-1]} written by a different spec ({shown}); "
                "use another training.output_dir, or set resume to the checkpoint path to continue anyway"
            ]
        )
    return str(checkpoints[-1])


def already_finished(output_dir: Path, checkpoint: Path, max_steps: int) -> bool:
    """Whether the run ended at ``checkpoint`` and wrote its final outputs.

    Resuming from a checkpoint at ``max_steps`` would make the Trainer take
    one step too many, so a finished run is left as it is.
    """
    try:
        step = json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]
        summary = json.loads((output_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError, KeyError):
        return False
    return 0 < max_steps <= step and summary.get("global_steps") == step


def _write_json_atomic(path: Path, data: Any) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(temporary, path)


# ---------------------------------------------------------------- summary


def run_summary(
    algorithm: str, spec: Spec, trainer: Any, metrics: Dict[str, Any], resumed_from: Optional[str], tokens: TokenCounter
) -> Dict[str, Any]:
    """``run_summary.json``: its keys are a contract (DESIGN.md)."""
    runtime = float(metrics.get("train_runtime", 0.0))
    total_tokens = int(trainer.state.num_input_tokens_seen or 0)
    attempt_tokens = total_tokens - tokens.at_start
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    first, last = metric_ends(trainer.state.log_history)
    return {
        "algorithm": algorithm,
        "world_size": world_size,
        "nnodes": world_size // local_world_size,
        "engine": engine(trainer),
        "global_steps": trainer.state.global_step,
        "train_runtime_s": runtime,
        "train_tokens": total_tokens or None,
        "tokens_per_s": attempt_tokens / runtime if attempt_tokens > 0 and runtime > 0 else None,
        "metrics_first": first,
        "metrics_last": last,
        "resumed_from": resumed_from,
        "spec": spec.model_dump(mode="json"),
    }


def check_engine(spec: Spec, trainer: Any) -> str:
    """The strategy the live trainer set up, if it is the one the spec asked for; else an error before training.

    accelerate can quietly set up something else (FSDP on CPU becomes DDP):
    a run never trains, or reports itself, as what it is not.
    """
    distributed = spec.distributed
    asked = "deepspeed" if distributed.deepspeed is not None else "fsdp" if distributed.fsdp is not None else None
    ran = engine(trainer)["strategy"]
    if asked is not None and ran != asked:
        raise SpecError([f"distributed.{asked}: asked for {asked}, but the trainer set up {ran}; not training"])
    return ran


def engine(trainer: Any) -> Dict[str, Any]:
    """What actually ran, read from the live trainer's accelerator."""
    from accelerate.utils import DistributedType

    accelerator = trainer.accelerator
    kind = accelerator.distributed_type
    if kind == DistributedType.DEEPSPEED:
        strategy = "deepspeed"
    elif kind == DistributedType.FSDP:
        strategy = "fsdp"
    elif kind in (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        strategy = "ddp"
    else:
        strategy = "single"
    plugin = accelerator.state.deepspeed_plugin if strategy == "deepspeed" else None
    return {
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "strategy": strategy,
        "zero_stage": plugin.zero_stage if plugin is not None else None,
    }


# Bookkeeping and speed the Trainer logs beside the metrics.
_NOT_METRICS = {"step", "epoch", "total_flos", "train_runtime", "train_tokens_per_second"}


def metric_ends(log_history: Sequence[Dict[str, Any]]) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Each logged metric averaged over its first and its last three values.

    The Trainer's closing summary entry (``train_loss``, ...) is left out.

    >>> history = [{"loss": v, "step": i} for i, v in enumerate([4.0, 3.0, 2.0, 1.0, 1.0, 1.0])]
    >>> metric_ends(history)
    ({'loss': 3.0}, {'loss': 1.0})
    """
    series: Dict[str, List[float]] = {}
    for entry in log_history:
        if "train_loss" in entry and "train_samples_per_second" in entry:
            continue
        for key, value in entry.items():
            if key not in _NOT_METRICS and isinstance(value, (int, float)) and not isinstance(value, bool):
                series.setdefault(key, []).append(float(value))
    first = {key: statistics.fmean(values[:3]) for key, values in series.items()}
    last = {key: statistics.fmean(values[-3:]) for key, values in series.items()}
    return first, last
