"""Fast paths, on by default where they compute what TRL's defaults compute, only faster.

Which algorithm takes which is its spec class's ``fast_paths`` (the
registry). A key the user set is never changed: setting it, to either value,
is the off-switch. ``run_summary.json`` lists what ran (``fast_paths``).
Measured gains: BENCHMARKS.md.

- ``padding_free`` (SFT, GRPO, RLOO, PPO): each batch is one row, its sequences one after
  another with positions restarting at 0, and no padding at all; TRL's
  default pads every row to the batch's longest. Per-sequence losses are
  those of the padded batch (tests/unit/speed/test_fast_paths.py) because the mask
  transformers builds from the positions keeps each sequence to itself. That
  holds for transformers' own models with a mask-aware attention
  implementation; for any other model the path stays off and the job says
  why. On by default on CPUs, and on GPUs with varlen attention (flash
  attention, ``torch_varlen``); with SDPA on GPUs it is slower (a dense mask
  over the whole row), so it stays off there. Off-switch: ``training.padding_free: false``. (``packing`` is not a
  default: it changes how many sequences a step trains on.) GRPO's and RLOO's forward passes over prompts and
  completions (the policy's, the old policy's, the reference's) are padding-free where the model's attention is
  varlen (on GPUs: ``torch_varlen``, flash attention; entrypoints/speed/rl_padding_free.py): the same log-probabilities,
  without the padding of each prompt to the longest and each completion to the longest. PPO's passes (the
  policy's, the value model's, the reference's: entrypoints/trainers/ppo_models.py) too. Off-switch:
  ``model.attn_implementation: sdpa``.
- ``torch_varlen`` attention (SFT, GRPO, RLOO, PPO, on GPUs that run torch's varlen kernels,
  for the model types it is checked for, in half precision): the kernels
  (entrypoints/speed/attention.py) attend within each sequence of a padding-free
  row, so padding-free pays on GPUs too. Off-switch:
  ``model.attn_implementation`` (e.g. ``sdpa``) or ``training.padding_free:
  false``.
- ``use_liger_kernel`` (SFT, on CUDA, when ``liger-kernel`` is installed):
  Liger's fused kernels (RMSNorm, RoPE, SwiGLU, and a cross-entropy that
  never materialises the logits). Not GRPO's or RLOO's: they have TRL's own
  fused LM head, and the layer kernels made their steps slower on an H200,
  mostly in ``generate`` (BENCHMARKS.md). Off-switch:
  ``training.use_liger_kernel: false``.
- ``gpu_batch`` (SFT, on CUDA, with Liger's fused loss): rows of
  ``max_length`` per device and step up to ``GPU_TOKENS_PER_STEP`` (64 rows
  of TRL's default 1024) instead of TRL's 8, where they fit
  (entrypoints/speed/gpu_memory.py): a 0.5B model's 8 rows leave an 80 GB GPU
  mostly idle. A step then trains on more sequences: the one default here
  that changes what training does, said in the job's first lines.
  Off-switch: ``training.per_device_train_batch_size`` (or
  ``gradient_accumulation_steps``).
- ``micro_batches`` (GRPO, RLOO, on CUDA, without FSDP or DeepSpeed): where an optimizer step's rows
  (``per_device_train_batch_size``, each up to the longest prompt and ``max_completion_length``) would not fit
  the GPU (entrypoints/speed/gpu_memory.py), they train as equal micro-batches, accumulated: the same
  generation batch, the same optimizer steps, the same loss for every loss type whose loss is a mean over rows
  or a token sum over the generation batch (not ``bnpo``, nor an entropy bonus or mask, whose means are per
  micro-batch, nor Liger's GRPO loss, unchecked, nor a model with attention dropout, which draws per micro-batch;
  tests/integration/test_micro_batches.py). Logged token means (``kl``, ``entropy``, the clip ratios) become means
  of the micro-batches' means. Said in the job's first lines. Off-switch:
  ``training.gradient_accumulation_steps``.
- no activation checkpointing (SFT): TRL turns it on to save GPU memory, and
  the backward then runs every layer's forward again; the same gradients
  without that, for more memory (activations are kept). On CPUs always; on
  GPUs without FSDP or DeepSpeed where the estimate of the step fits the
  GPU's memory (entrypoints/speed/gpu_memory.py). Measured for SFT only: DPO and GRPO did not gain on CPU.
  Off-switch: ``training.activation_checkpointing: true``.

The job's first lines say what it chose on a GPU, and why.
"""

import dataclasses
import importlib.util
import logging
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch

from posttrain.components.spec.fields import config_value
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.schema import CHECKPOINTING_OPTIONS, CHECKPOINTING_SWITCHES, PACKING_AWARE_ATTENTION
from posttrain.components.spec.sections import ModelSpec
from posttrain.entrypoints.speed import attention, gpu_memory, rl_padding_free, rollout_generator

log = logging.getLogger("posttrain")

# Kernels that attend within each sequence of the row (varlen): the only ones where padding-free pays on GPUs.
# With the others the row gets a dense mask over all of it, which cost 2x on an H100 (BENCHMARKS.md).
VARLEN_KERNELS = ("flash_attention_2", "flash_attention_3", attention.NAME)
# The model types whose attention torch_varlen is a default for: those tests/unit/speed/test_attention.py checks
# against SDPA (causal, no softcapping, no sinks, one head size). Any other model may name it in the spec.
VARLEN_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# the keys, old names and new, that turn activation checkpointing on or off or configure it
CHECKPOINTING_KEYS = {*CHECKPOINTING_SWITCHES, *CHECKPOINTING_OPTIONS}
# SFT's tokens per device and step on a GPU where the spec leaves the batch: 64 rows of TRL's default max_length.
# There one H100 trained Qwen2.5-0.5B's shape at 33.5% MFU, against 9.2% with TRL's 8 rows (BENCHMARKS.md).
GPU_TOKENS_PER_STEP = 65536
# TRL 1.16's GRPO loss types whose loss over an optimizer step changes with its split into micro-batches
# (GRPOTrainer._compute_loss): bnpo's token mean is per micro-batch. Each other one is a mean over rows, each
# micro-batch's divided by their number, or a token sum over the generation batch's token count; RLOO's loss is a
# mean over rows.
SPLIT_DEPENDENT_LOSSES = ("bnpo",)
# what installs the packages the GPU defaults need (setup.cfg's gpu extra)
INSTALL_GPU = "pip install 'posttrain[gpu]'"


@dataclasses.dataclass(frozen=True)
class FastPathOptions:
    """What the fast paths are chosen from, read from the spec once: the ones the algorithm takes (its spec
    class's ``fast_paths``), its TRL config class, the model, the ``training`` keys the user set (never changed),
    whether the job is sharded, and whether its passes over generated completions are TRL's GRPO or RLOO
    trainer's, made padding-free by ``switch_passes_to_padding_free`` rather than by a collator (PPO's trainer
    packs its own: entrypoints/trainers/ppo_models.py)."""

    offered: Tuple[str, ...]
    config_class: str
    model: ModelSpec
    training: Mapping[str, Any]
    sharded: bool = False
    rl_passes: bool = False


def config_defaults(options: FastPathOptions, on_cuda: bool, training: Mapping[str, Any]) -> Dict[str, Any]:
    """The fast paths set in the TRL config: keyword arguments the user left unset. ``training``: the
    keyword arguments so far (the batch)."""
    defaults: Dict[str, Any] = {}
    if "use_liger_kernel" in options.offered and "use_liger_kernel" not in options.training and on_cuda:
        if importlib.util.find_spec("liger_kernel") is not None:
            defaults["use_liger_kernel"] = True
        else:
            _say(f"Liger's kernels are off: liger-kernel is not installed ({INSTALL_GPU})")
    # its options too: the user wants it
    checkpointing_set = CHECKPOINTING_KEYS & set(options.training)
    if "no_activation_checkpointing" in options.offered and not checkpointing_set:
        if not on_cuda:
            defaults["activation_checkpointing"] = False
        elif not options.sharded and activations_fit(options, {**training, **defaults}):
            # (sharded: the strategy places checkpointing itself)
            defaults["activation_checkpointing"] = False
    return defaults


def gpu_batch(options: FastPathOptions, on_cuda: bool) -> Dict[str, Any]:
    """SFT's rows per device on a GPU where the spec leaves the step's size: ``GPU_TOKENS_PER_STEP`` over
    ``max_length``, where Liger's fused loss takes the logits away and the estimate says they fit with
    activation checkpointing; else nothing (TRL's 8 rows)."""
    training = options.training
    sized = {"per_device_train_batch_size", "gradient_accumulation_steps"} & set(training)
    if "gpu_batch" not in options.offered or not on_cuda or sized:
        return {}
    max_length = config_value(options.config_class, training, "max_length")
    shape = gpu_memory.model_shape(options.model)
    # no max_length: no bound on a row
    if not max_length or shape is None or not fused_loss(training, shape):
        return {}
    rows = max(1, GPU_TOKENS_PER_STEP // max_length)
    step = state_bytes(options, shape) + shape.activation_bytes(
        rows * max_length, checkpointing=True, half=computes_in_16_bits(training)
    )
    return {"per_device_train_batch_size": rows} if gpu_memory.fits(step) else {}


def micro_batches(
    options: FastPathOptions, on_cuda: bool, args: Any, longest_prompt: Callable[[], int]
) -> Dict[str, Any]:
    """GRPO's and RLOO's step on a GPU where its rows would not fit: ``per_device_train_batch_size`` rows as
    the fewest equal micro-batches that do, accumulated (``gradient_accumulation_steps``; ``steps_per_generation``
    scaled where the spec sets it), so the generation batch and the optimizer steps stay the spec's. ``args``: the
    TRL config the spec makes; ``longest_prompt``: its data's longest prompt in tokens, asked only where the rest
    allows a split. Else nothing: the spec sets gradient_accumulation_steps, the job is sharded, the loss
    depends on the split, or the rows fit (or not even one does)."""
    if "micro_batches" not in options.offered or not on_cuda or options.sharded:
        return {}
    if "gradient_accumulation_steps" in options.training or args.per_device_train_batch_size == 1:
        return {}
    if getattr(args, "loss_type", None) in SPLIT_DEPENDENT_LOSSES or getattr(args, "use_liger_kernel", False):
        return {}
    entropy_bonus = getattr(args, "entropy_coef", 0.0) or getattr(args, "use_adaptive_entropy", False)
    if entropy_bonus or getattr(args, "top_entropy_quantile", 1.0) < 1.0:
        return {}
    shape = gpu_memory.model_shape(options.model)
    # attention dropout draws per micro-batch: the same loss in distribution only
    if shape is None or shape.attention_dropout:
        return {}
    row = longest_prompt() + args.max_completion_length
    # the reference model's frozen copy, where the KL term needs one
    reference = shape.frozen_bytes() if args.beta != 0.0 and options.model.lora is None else 0
    held = state_bytes(options, shape) + reference
    if getattr(args, "use_vllm", False) and args.vllm_mode == "colocate":
        # vLLM's share of the same GPU
        held += int(args.vllm_gpu_memory_utilization * gpu_memory.gpu_bytes())
    rows = args.per_device_train_batch_size
    for micro in (n for n in range(rows, 0, -1) if rows % n == 0):
        activations = shape.activation_bytes(
            micro * row, args.activation_checkpointing, half=computes_in_16_bits(options.training)
        )
        if gpu_memory.fits(held + activations):
            break
    else:
        return {}
    if micro == rows:
        return {}
    accumulated = rows // micro
    split: Dict[str, Any] = {"per_device_train_batch_size": micro, "gradient_accumulation_steps": accumulated}
    if "steps_per_generation" in options.training:
        split["steps_per_generation"] = options.training["steps_per_generation"] * accumulated
    _say(
        f"on a GPU of {gpu_memory.gpu_bytes() / 1e9:.0f} GB: each optimizer step's {rows} rows per device (of up to "
        f"{row} tokens) train as {accumulated} micro-batches of {micro}, accumulated: the same loss and steps "
        "(training.gradient_accumulation_steps sets them)"
    )
    return split


def state_bytes(options: FastPathOptions, shape: gpu_memory.ModelShape) -> int:
    """The training state of an unsharded job's model: whole, LoRA's frozen weights, or QLoRA's 4-bit ones."""
    trained = "4bit" if options.model.quantization else "full" if options.model.lora is None else "lora"
    return shape.state_bytes(trained)


def computes_in_16_bits(training: Mapping[str, Any]) -> bool:
    """Whether a GPU step computes in 16 bits: bf16 (TRL's default on GPUs) or fp16 mixed precision."""
    return bool(training.get("bf16", True) or training.get("fp16"))


def fused_loss(training: Mapping[str, Any], shape: gpu_memory.ModelShape) -> bool:
    """Whether Liger's fused cross-entropy will compute the loss: on, installed, and made for this model type."""
    if not training.get("use_liger_kernel", True) or importlib.util.find_spec("liger_kernel") is None:
        return False
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    return shape.model_type in MODEL_TYPE_TO_APPLY_LIGER_FN


def activations_fit(options: FastPathOptions, training: Mapping[str, Any]) -> bool:
    """Whether a step keeps all its activations within this GPU's memory (gpu_memory.py); said on rank 0."""
    max_length = config_value(options.config_class, training, "max_length")
    shape = gpu_memory.model_shape(options.model)
    if not max_length or shape is None:
        return False
    rows = config_value(options.config_class, training, "per_device_train_batch_size")
    tokens = rows * max_length
    activations = shape.activation_bytes(tokens, checkpointing=False, half=computes_in_16_bits(training))
    logits = 0 if fused_loss(training, shape) else shape.logit_bytes(tokens)
    state = state_bytes(options, shape)
    fits = gpu_memory.fits(activations + logits + state)
    if int(os.environ.get("RANK", "0")) == 0:
        log.info(
            "on a GPU of %.0f GB: %d rows of up to %d tokens per device and step (training."
            "per_device_train_batch_size sets them); activations of up to %.0f GB%s and a training state of %.0f GB "
            "%s, so activation checkpointing is %s (training.activation_checkpointing sets it)",
            gpu_memory.gpu_bytes() / 1e9,
            rows,
            max_length,
            activations / 1e9,
            f", logits of {logits / 1e9:.0f} GB" if logits else "",
            state / 1e9,
            "fit" if fits else "would not fit",
            "off" if fits else "on",
        )
    return fits


def attention_implementation(options: FastPathOptions) -> Optional[str]:
    """The model's attention implementation: the spec's; or, on a GPU where the spec leaves it to the
    padding-free fast path, ``torch_varlen`` where this GPU and torch run it and the model is of a type it is
    checked for, in half precision; None is transformers' default (SDPA)."""
    chosen = options.model.attn_implementation
    if chosen is not None or "padding_free" not in options.offered or options.training.get("padding_free") is False:
        return chosen
    unavailable = attention.varlen_available()
    if unavailable is not None:
        if torch.cuda.is_available():
            # a torch too old is the gpu extra's to fix; an older GPU or ROCm is not
            hint = f" ({INSTALL_GPU})" if "torch >= 2.11" in unavailable else ""
            _say(f"torch_varlen attention is off: {unavailable}{hint}; padding-free rows stay off too")
        return None
    shape = gpu_memory.model_shape(options.model)
    if shape is None or shape.model_type not in VARLEN_MODEL_TYPES or shape.attention_dropout:
        return None
    # float32: no varlen kernel takes it
    if not computes_in_16_bits(options.training) and shape.weight_bytes != 2:
        return None
    return attention.NAME


def _say(line: str) -> None:
    """One of the job's first lines, on rank 0."""
    if int(os.environ.get("RANK", "0")) == 0:
        log.info(line)


def padding_free_reason(model: Any) -> Optional[str]:
    """Why packed sequences could see each other in ``model``'s attention; None where they cannot."""
    # a PEFT model: what it wraps
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    module = type(model).__module__
    if not module.startswith("transformers.models."):
        return f"{type(model).__name__} comes from {module}, not transformers' own models"
    implementation = model.config._attn_implementation
    if implementation not in PACKING_AWARE_ATTENTION:
        return f"attn_implementation {implementation!r} is not one of {', '.join(PACKING_AWARE_ATTENTION)}"
    return None


def data_collator(options: FastPathOptions, model: Any, tokenizer: Any, args: Any, dataset: Any) -> Optional[Any]:
    """SFT's collator, chosen before its trainer: TRL's own, padding-free, where the spec leaves it to us and the
    model keeps sequences apart; None leaves TRL's choice.

    Passed to the trainer rather than asked of its config: TRL 1.16 refuses
    ``padding_free`` with a ``max_length`` ("not enforced"), yet its dataset
    preparation truncates to ``max_length`` before any batch is made
    (``SFTTrainer._prepare_dataset``), so the collator is all that changes.
    Where the user asked for packing or padding-free batches and the model
    could let sequences see each other, the job stops and says why.
    """
    if "padding_free" not in options.offered or options.rl_passes:
        return None
    reason = padding_free_reason(model)
    # TRL's own test
    if args.padding_free or (args.packing and args.packing_strategy in ("bfd", "bfd_split")):
        if reason is not None:
            key = "packing" if args.packing else "padding_free"
            raise SpecError([f"training.{key}: packed sequences could attend to each other: {reason}; set it to false"])
        return None
    # TRL's vision rows
    if "padding_free" in options.training or {"image", "images"} & set(dataset.column_names):
        return None
    implementation = model.config._attn_implementation
    if reason is None and torch.cuda.is_available() and implementation not in VARLEN_KERNELS:
        reason = f"on GPUs, {implementation} attention over one long row is slower than padding (BENCHMARKS.md)"
    if reason is not None:
        log.info("padding-free batches stay off: %s", reason)
        return None
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    # what SFTTrainer does for the collator it builds, and skips for one it is given
    pad_token = args.pad_token or tokenizer.pad_token or tokenizer.eos_token
    if pad_token not in tokenizer.get_vocab():
        # the trainer says why
        return None
    tokenizer.pad_token = pad_token
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return DataCollatorForLanguageModeling(
        pad_token_id=tokenizer.pad_token_id, padding_free=True, pad_to_multiple_of=args.pad_to_multiple_of
    )


def packs_passes(model: Any) -> bool:
    """Whether ``model``'s passes over packed rows keep each sequence alone, with kernels that pay for it (varlen):
    GRPO's, RLOO's and PPO's passes are padding-free where they do."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.config._attn_implementation in VARLEN_KERNELS and padding_free_reason(base) is None


def switch_passes_to_padding_free(trainer: Any, rollouts: bool = True) -> None:
    """GRPO's and RLOO's forward passes padding-free (rl_padding_free.py) where the model's attention is varlen,
    their generation with a KV cache, without vLLM by the rollout generator where ``rollouts`` (the spec's
    ``generation.rollout_generator``) and it decodes the trainer's settings (else rank 0 says why not); on a GPU,
    rank 0 says what generates and whether the passes are padding-free."""
    rl_padding_free.generate_with_a_kv_cache(trainer)
    args = trainer.args
    engine = "transformers' generate (training.use_vllm: true generates with vLLM, where installed)"
    transformers_generate = not getattr(args, "use_vllm", False)
    if transformers_generate and not getattr(args, "use_transformers_continuous_batching", False) and rollouts:
        why = rollout_generator.install(trainer)
        if why is None:
            engine = "posttrain's rollout generator (generation.rollout_generator: false: transformers' generate)"
        elif int(os.environ.get("RANK", "0")) == 0:
            log.info("rollouts: transformers' generate, not the rollout generator, which does not decode %s", why)
    model = trainer.accelerator.unwrap_model(trainer.model)
    if packs_passes(model):
        rl_padding_free.pack_passes(trainer)
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    implementation = model.config._attn_implementation
    if not torch.cuda.is_available() or int(os.environ.get("RANK", "0")) != 0:
        return
    if getattr(trainer, "padding_free_passes", False):
        passes = f"padding-free ({implementation} attention; model.attn_implementation: sdpa pads them)"
    else:
        passes = f"padded: {implementation} attention over one long row is slower than padding (BENCHMARKS.md)"
    if getattr(args, "use_vllm", False):
        engine = f"vLLM ({args.vllm_mode})"
    elif getattr(args, "use_transformers_continuous_batching", False):
        engine = "transformers' continuous batching"
    log.info("forward passes over prompts and completions: %s; completions generated by %s", passes, engine)


def applied(trainer: Any, options: FastPathOptions) -> List[str]:
    """The fast paths the live trainer runs with."""
    found = []
    chosen = gpu_batch(options, on_cuda=trainer.args.device.type == "cuda")
    if chosen and chosen["per_device_train_batch_size"] == trainer.args.per_device_train_batch_size:
        found.append("gpu_batch")
    if getattr(getattr(trainer, "data_collator", None), "padding_free", False):
        found.append("padding_free")
    if getattr(trainer, "padding_free_passes", False):
        found.append("padding_free")
    if getattr(trainer, rollout_generator.NAME, False):
        found.append(rollout_generator.NAME)
    # PPO's model: its policy and value model in one module, under DDP where it runs in several processes
    model = getattr(trainer.model, "module", trainer.model)
    model = getattr(model, "policy", model)
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == attention.NAME:
        found.append(attention.NAME)
    if getattr(trainer.args, "use_liger_kernel", False):
        found.append("use_liger_kernel")
    spec_rows = config_value(options.config_class, options.training, "per_device_train_batch_size")
    if "micro_batches" in options.offered and trainer.args.per_device_train_batch_size < spec_rows:
        found.append("micro_batches")
    fsdp_checkpointing = (getattr(trainer.args, "fsdp_config", None) or {}).get("activation_checkpointing")
    if getattr(trainer.args, "activation_checkpointing", None) is False and not fsdp_checkpointing:
        found.append("no_activation_checkpointing")
    return found
