"""The trainer's config: TRL's config class from the user's ``training`` and what posttrain owns (the hardware,
the sharding, the fast paths, vLLM), and what it needs of the job's environment."""

import importlib.util
import sys
from typing import Any, Dict

import torch
from transformers import Trainer

from posttrain.components.spec.fields import config_fields
from posttrain.components.spec.messages import SpecError, first_line
from posttrain.components.spec.schema import CHECKPOINTING_OPTIONS, Spec
from posttrain.entrypoints.generation import vllm_generation
from posttrain.entrypoints.inputs.models import import_object, model_config
from posttrain.entrypoints.job.sharding import may_leave_parameters_unused, strategy_for
from posttrain.entrypoints.job.spec_parts import parts
from posttrain.entrypoints.process import distributed
from posttrain.entrypoints.speed import fast_paths


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
    split = parts(spec)
    rewards = getattr(spec, "rewards", [])
    if rewards and "reward_weights" in config_fields(spec.config_class):
        # else the trainer takes them itself
        # an agent program's (or a verifiers environment's) reward last, as the job hands it to the trainer
        kwargs["reward_weights"] = [reward.weight for reward in rewards] + [1.0] * (split.agent is not None)
    kwargs.update(strategy_for(spec.distributed).trainer_arguments(spec.config_class, kwargs))
    kwargs.update(fast_paths.config_defaults(split.fast_paths, on_cuda=not on_cpu, training=kwargs))
    if kwargs.get("use_vllm"):
        if importlib.util.find_spec("vllm") is None:
            raise SpecError(["training.use_vllm: vLLM is not installed in the job's environment (pip install vllm)"])
        # checks, then adapts TRL's
        kwargs.update(
            vllm_generation.prepare(type(spec), spec.model, kwargs, on_cpu, getattr(spec, "generation", None))
        )
    return kwargs
