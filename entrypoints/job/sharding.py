"""One strategy per ``distributed`` choice: DDP (one process too), DeepSpeed, FSDP.

Everything that differs between them in the job is here: the hardware
check, the process group's set-up, the training arguments that turn the
strategy on, the preparation of the final save, the check that the live
trainer runs what was asked, and the teardown. What a strategy refuses (of
the hardware, of ``training``) is said by the spec's ``distributed`` section
(``components/spec/sections.py``), which the client asks at submit and the
hardware check here asks again. :func:`strategy_for` picks one from it.
"""

import os
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict

import torch

from posttrain.components.spec.fields import config_value
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.sections import DeepSpeedSpec, DistributedSpec, FSDPSpec
from posttrain.entrypoints.process import distributed
from posttrain.entrypoints.records.summary import engine


class Strategy:
    """What every strategy does; each subclass changes what differs."""

    def __init__(self, spec: DistributedSpec) -> None:
        self.spec = spec
        self.timeout = timedelta(seconds=spec.timeout_s)

    def check_hardware(self) -> None:
        """Refuses, before anything starts, hardware this strategy cannot run on (as the spec's section says)."""
        problems = [] if torch.cuda.is_available() else self.spec.gpu_problems("this job sees no GPU")
        # the launcher's processes on this node, each of which takes a GPU of its own (DeepSpeed's says LOCAL_SIZE)
        processes = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or "1")
        if torch.cuda.is_available() and processes > torch.cuda.device_count():
            problems.append(
                f"-j: {processes} processes on this node, which has {torch.cuda.device_count()} GPU(s) it can see; "
                "give each process a GPU (-j <nodes>x<GPUs per node>), or run on CPU (--gpu 0)"
            )
        if problems:
            raise SpecError(problems)

    def init_process_group(self) -> None:
        """Creates the process group with ``distributed.timeout_s`` (with use_cpu transformers ignores ddp_timeout)."""
        distributed.init_process_group(distributed.group_backend(), self.timeout)

    def trainer_arguments(self, config_class: str, training: Dict[str, Any]) -> Dict[str, Any]:
        """The training arguments that turn this strategy on, beside ``training``."""
        return {}

    def check_engine(self, trainer: Any) -> str:
        """The strategy the live trainer set up, if it is this one; else an error before training.

        accelerate can quietly set up something else (FSDP on CPU becomes DDP):
        a run never trains, or reports itself, as what it is not.
        """
        ran = engine(trainer)["strategy"]
        if ran != self.spec.strategy:
            name = self.spec.strategy
            raise SpecError([f"distributed.{name}: asked for {name}, but the trainer set up {ran}; not training"])
        return ran

    def prepare_final_save(self, trainer: Any) -> None:
        """Makes ``trainer.save_model`` write one plain ``from_pretrained`` directory."""

    def teardown(self, trainer: Any) -> None:
        """Ends training on every rank before the process group goes."""
        # every rank finishes before any tears down: a rank leaving while others still write aborted
        # ZeRO-3 runs at exit ("terminate called without an active exception", 1 run in 20 here; what
        # remained of that abort is gloo's, see distributed.destroy_process_group)
        distributed.barrier()


class DDP(Strategy):
    """Data parallel (one process is the degenerate case): every rank holds the whole model."""

    def check_engine(self, trainer: Any) -> str:
        # nothing was asked beyond plain data parallelism: one process runs "single", several "ddp"
        return engine(trainer)["strategy"]


class DeepSpeed(Strategy):
    """DeepSpeed ZeRO through the HF integration, on CPU or GPU."""

    def init_process_group(self) -> None:
        """The process group, then DeepSpeed's communication layer adopting it.

        Both exist before the training arguments do: ZeRO-3 partitions the
        model as it loads. The group has the one backend DeepSpeed's layer is
        told (its collectives name it), so posttrain's flags use it too.
        """
        backend = distributed.device_backend()
        if distributed.init_process_group(backend, self.timeout):
            _import_deepspeed().init_distributed(dist_backend=backend, timeout=self.timeout)

    def trainer_arguments(self, config_class: str, training: Dict[str, Any]) -> Dict[str, Any]:
        return {"deepspeed": deepspeed_config(self.spec.deepspeed)}

    def teardown(self, trainer: Any) -> None:
        super().teardown(trainer)
        # the engine goes before the process group
        trainer.model_wrapped.destroy()
        distributed.barrier()


class FSDP(Strategy):
    """FSDP2 through the HF integration; GPUs only."""

    def trainer_arguments(self, config_class: str, training: Dict[str, Any]) -> Dict[str, Any]:
        return fsdp_arguments(self.spec.fsdp, config_class, training)

    def prepare_final_save(self, trainer: Any) -> None:
        # checkpoints stay sharded (each rank writes its part); the final model is one from_pretrained directory
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")


# Config keys of architectures whose forward can leave parameters without a gradient: experts no token was routed
# to, a vision or audio tower that a text-only batch skips
_PARTIAL_FORWARD_KEYS = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "moe_num_experts",
    "vision_config",
    "audio_config",
)


def may_leave_parameters_unused(config: Any) -> bool:
    """Whether DDP must search each backward for parameters the forward left unused (``find_unused_parameters``),
    from the model's config (None: unknown, search).

    Unset, transformers searches for every model trained without activation checkpointing; for a model whose
    forward uses every parameter that search is wasted, and DDP warns of it from every rank.
    """
    return config is None or any(getattr(config, key, None) for key in _PARTIAL_FORWARD_KEYS)


def strategy_for(spec: DistributedSpec) -> Strategy:
    """The strategy the spec's ``distributed`` section asks for."""
    if spec.deepspeed is not None:
        return DeepSpeed(spec)
    if spec.fsdp is not None:
        return FSDP(spec)
    return DDP(spec)


def _import_deepspeed() -> Any:
    """DeepSpeed, or a clear error: a run that asked for it never falls back to DDP."""
    try:
        import deepspeed
    except ImportError as error:
        raise SpecError([f"distributed.deepspeed: DeepSpeed cannot be imported in the job: {error}"]) from None
    return deepspeed


def deepspeed_config(ds: DeepSpeedSpec) -> Any:
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
        # save a plain from_pretrained model
        zero["stage3_gather_16bit_weights_on_model_save"] = True
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
