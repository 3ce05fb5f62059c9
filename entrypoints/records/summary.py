"""``run_summary.json``: what ran and what it learned. Its keys are a contract (docs/pages/outputs.md)."""

import os
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from posttrain.components.spec.chain import STAGE_ENV
from posttrain.entrypoints.generation import run_ahead, vllm_generation
from posttrain.entrypoints.process.distributed import backend_for, world_size

SUMMARY_FILE = "run_summary.json"

# What the closing line reports, the first an algorithm logs: the online ones' reward, PPO's scores, else the loss
HEADLINE_METRICS = ("reward", "objective/scores", "loss")
# Bookkeeping and speed the Trainer logs beside the metrics.
_NOT_METRICS = {"step", "epoch", "total_flos", "train_runtime", "train_tokens_per_second"}


def run_summary(
    algorithm: str,
    spec_record: Dict[str, Any],
    trainer: Any,
    metrics: Dict[str, Any],
    resumed_from: Optional[str],
    tokens_at_start: int,
    inputs: Optional[Dict[str, Any]],
    fast_paths: List[str],
    generates: bool,
) -> Dict[str, Any]:
    """The contents of ``run_summary.json``, read from the live trainer; ``spec_record`` is the spec's JSON dump,
    ``tokens_at_start`` the tokens seen before this attempt, ``inputs`` what it was trained on and from
    (``checkpoints.job_inputs``), ``fast_paths`` those it ran (``fast_paths.applied``)."""
    runtime = float(metrics.get("train_runtime", 0.0))
    total_tokens = int(trainer.state.num_input_tokens_seen or 0)
    attempt_tokens = total_tokens - tokens_at_start
    world = world_size()
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    first, last = metric_ends(trainer.state.log_history)
    return {
        "algorithm": algorithm,
        # this finished run, new each time it trains (what a later run was trained from is known by content)
        "run_id": uuid.uuid4().hex,
        "world_size": world,
        "nnodes": world // local_world_size,
        "engine": engine(trainer),
        "weights": weights(trainer),
        "fast_paths": fast_paths,
        "global_steps": trainer.state.global_step,
        "train_runtime_s": runtime,
        "train_tokens": total_tokens or None,
        "tokens_per_s": attempt_tokens / runtime if attempt_tokens > 0 and runtime > 0 else None,
        "metrics_first": first,
        "metrics_last": last,
        "resumed_from": resumed_from,
        "spec": spec_record,
        "inputs": inputs,
        "generation": generation(trainer) if generates else None,
    }


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
        # the gradients'
        "backend": backend_for(accelerator.device.type),
        "strategy": strategy,
        "zero_stage": plugin.zero_stage if plugin is not None else None,
    }


def weights(trainer: Any) -> Dict[str, Any]:
    """The trained model's weights as the run held them: quantized (``4bit``) or not, their bytes in rank 0's memory
    (its shard under ZeRO-3), and how many parameters trained (an adapter's, under LoRA)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    parameters = list(model.parameters())
    # a ZeRO-3 parameter holds its shard aside, and its whole size as ds_numel
    held = [getattr(p, "ds_tensor", p) for p in [*parameters, *model.buffers()]]
    return {
        "quantization": "4bit" if getattr(model, "is_loaded_in_4bit", False) else None,
        "bytes": sum(tensor.nelement() * tensor.element_size() for tensor in held),
        "trainable_parameters": sum(getattr(p, "ds_numel", p.numel()) for p in parameters if p.requires_grad),
    }


def generation(trainer: Any) -> Dict[str, Any]:
    """How completions were generated: the engine, vLLM's mode and weight sync, and (vLLM) this process's tokens/s."""
    args = trainer.args
    if not getattr(args, "use_vllm", False):
        mode = "continuous_batching" if getattr(args, "use_transformers_continuous_batching", False) else "generate"
        return {"engine": "transformers", "mode": mode, "weight_sync": None, "tokens_per_s": None}
    # GRPO's and RLOO's; online DPO generates in its own way
    counted = getattr(trainer, "vllm_generation", None)
    seconds = getattr(counted, vllm_generation.SECONDS, 0.0)
    turns = run_ahead.of(trainer)
    return {
        "engine": "vllm",
        "mode": args.vllm_mode,
        "weight_sync": vllm_generation.weight_sync(args.vllm_mode, on_cpu=args.use_cpu),
        "tokens_per_s": getattr(counted, vllm_generation.TOKENS, 0) / seconds if seconds > 0 else None,
        # how the trainers and the vllm role took turns (server mode)
        "turns": turns.summary() if turns is not None else None,
    }


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


# What TRL's model card says of a base model that is not a hub id (a built-in or local one): a link to nowhere
_NO_BASE_MODEL = "[None](https://huggingface.co/None)"


def write_model_card(trainer: Any, output_dir: Path, base_model: str) -> None:
    """TRL's model card (``README.md``) in ``output_dir``, naming the base model as the spec does: TRL names and
    links a hub id, and writes "[None]" for any other. posttrain's PPO trainer writes none."""
    if not hasattr(trainer, "create_model_card"):
        return
    trainer.create_model_card(model_name=output_dir.name)
    card = output_dir / "README.md"
    text = card.read_text()
    if _NO_BASE_MODEL in text:
        card.write_text(text.replace(_NO_BASE_MODEL, f"`{base_model}`"))


def say_closing(line: str) -> None:
    """A finished run's last line (``posttrain: ...``); a chain's stage says it as the chain's (``chain: stage
    <name>: ...``), so that the chain's own closing line is the job's one posttrain: line."""
    stage = os.environ.get(STAGE_ENV)
    print(line.replace("posttrain: ", f"chain: stage {stage}: ", 1) if stage else line, file=sys.stderr, flush=True)


def closing_line(summary: Dict[str, Any], output_dir: str) -> str:
    """A run's last line: what it did, how long it took, how its headline metric moved, and where the model is.

    >>> closing_line({"algorithm": "sft", "global_steps": 40, "train_runtime_s": 12.3,
    ...               "metrics_first": {"loss": 6.25}, "metrics_last": {"loss": 0.781}}, "outputs/sft-tiny")
    'posttrain: sft finished 40 steps in 12 s, loss 6.25 -> 0.781; model in outputs/sft-tiny'
    """
    first, last = summary["metrics_first"], summary["metrics_last"]
    key = next((key for key in HEADLINE_METRICS if key in first and key in last), None)
    moved = "" if key is None else f", {key} {first[key]:.3g} -> {last[key]:.3g}"
    return (
        f"posttrain: {summary['algorithm']} finished {summary['global_steps']} steps in "
        f"{summary['train_runtime_s']:.0f} s{moved}; model in {output_dir}"
    )
