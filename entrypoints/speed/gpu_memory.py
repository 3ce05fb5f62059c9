"""How much of a GPU a training step takes: the estimate behind the GPU batch and checkpointing defaults
(fast_paths), and the tables of docs/pages/gpu-memory.md (``python -m posttrain.entrypoints.speed.gpu_memory``).

A step holds the training state (``ModelShape.state_bytes``: the weights, and
for full training their gradients and the optimizer's state, as each
strategy keeps and shards them), frozen copies (a reference model), the
activations the backward needs (all of them, or with activation
checkpointing each layer's input and one layer's worth recomputed; the worst
case is every row ``max_length`` tokens long), and, without Liger's fused
loss, the logits (bf16, their float32 copy for the loss, and its gradient).
It fits where that total is within ``MEMORY_SHARE`` of the GPU's memory.
Generation's KV cache (GRPO, RLOO, online DPO: ``kv_cache_bytes``) is held
while generating, not in the backward, so the step's estimate leaves it out;
the page's table gives it. Allocator fragmentation is not counted.
"""

import dataclasses
import functools
from typing import List, Optional, Tuple

import torch

from posttrain.components.spec.sections import ModelSpec

# What a decoder layer keeps for its backward, per token, in bytes at 16 bits: about 16 x hidden (norms, the
# attention's inputs and output) and 6 x intermediate (the gated MLP's three products), as Korthikanti et al.
# count them (2022, "Reducing Activation Recomputation in Large Transformer Models": 34 x hidden for a classic
# MLP), less the scores flash-style kernels never keep.
ACTIVATION_BYTES_PER_HIDDEN, ACTIVATION_BYTES_PER_INTERMEDIATE = 16, 6
# bf16 logits, their float32 copy in the loss, and its gradient
LOGIT_BYTES = 2 + 4 + 4
# of the GPU's memory: what allocator fragmentation and the kernels' workspaces leave
MEMORY_SHARE = 0.9
# bitsandbytes' NF4 (model.quantization: 4bit): half a byte per weight, and each block of 64 weights' scale in 8 bits
# (double quantization)
FOUR_BIT_BYTES = 0.5 + 1 / 64
# DeepSpeed under bf16 keeps float32 master weights and AdamW's two moments in float32
DEEPSPEED_OPTIMIZER_BYTES = 12
# accelerate's FSDP2 upcasts 16-bit weights to float32 under mixed precision: weights, gradients, two moments
FSDP_BYTES = 16


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the estimate reads from a decoder's config."""

    model_type: str
    hidden: int
    intermediate: int
    layers: int
    vocabulary: int
    # the output layer is the embedding
    tied: bool
    attention_dropout: float
    # 2 for bf16 and fp16 weights, else 4
    weight_bytes: int

    # grouped-query attention's K and V width (key-value heads x head size); None: as wide as the queries
    kv_hidden: Optional[int] = None

    @property
    def linear_parameters(self) -> int:
        """Every layer's attention and MLP weights: what 4-bit quantization stores in 4 bits."""
        kv = self.kv_hidden or self.hidden
        return self.layers * (
            2 * self.hidden * self.hidden + 2 * self.hidden * kv + 3 * self.hidden * self.intermediate
        )

    @property
    def parameters(self) -> int:
        """The linear layers and the embedding (twice where the output layer is its own); norms and biases are
        left out."""
        return self.linear_parameters + self.vocabulary * self.hidden * (1 if self.tied else 2)

    def state_bytes(self, trained: str = "full", strategy: str = "ddp", gpus: int = 1) -> int:
        """Per GPU, for ``trained`` "full", "lora" (model.lora) or "4bit" (model.quantization) and ``strategy``
        "ddp" (a copy per GPU), "zero2", "zero3" or "fsdp" (distributed.*). Full training keeps the weights,
        their gradients and AdamW's two moments: with a copy per GPU all four in the weights' dtype, as torch's
        AdamW keeps them; DeepSpeed's weights and gradients in 16 bits and its float32 optimizer state, ZeRO-2
        sharding all but the weights and ZeRO-3 everything; FSDP everything in float32, sharded. LoRA keeps the
        frozen weights (its adapter's state is negligible), sharded under ZeRO-3 and FSDP; 4-bit LoRA its linear
        layers in 4 bits."""
        sharded = gpus if strategy in ("zero3", "fsdp") else 1
        if trained == "4bit":
            return int(
                FOUR_BIT_BYTES * self.linear_parameters + self.weight_bytes * (self.parameters - self.linear_parameters)
            )
        if trained == "lora":
            return self.weight_bytes * self.parameters // sharded
        if strategy == "zero2":
            return 2 * self.parameters + (2 + DEEPSPEED_OPTIMIZER_BYTES) * self.parameters // gpus
        if strategy == "zero3":
            return (2 + 2 + DEEPSPEED_OPTIMIZER_BYTES) * self.parameters // gpus
        if strategy == "fsdp":
            return FSDP_BYTES * self.parameters // gpus
        return 4 * self.weight_bytes * self.parameters

    def frozen_bytes(self, strategy: str = "ddp", gpus: int = 1) -> int:
        """Per GPU, a frozen copy of the model (DPO's reference): sharded under ZeRO-3 and FSDP, whole beside
        ZeRO-2 (TRL prepares it without ZeRO there)."""
        return self.weight_bytes * self.parameters // (gpus if strategy in ("zero3", "fsdp") else 1)

    def activation_bytes(self, tokens: int, checkpointing: bool, half: bool) -> int:
        layer = ACTIVATION_BYTES_PER_HIDDEN * self.hidden + ACTIVATION_BYTES_PER_INTERMEDIATE * self.intermediate
        kept = self.layers * 2 * self.hidden + layer if checkpointing else self.layers * layer
        return (1 if half else 2) * kept * tokens

    def logit_bytes(self, tokens: int) -> int:
        return LOGIT_BYTES * self.vocabulary * tokens

    def kv_cache_bytes(self, tokens: int) -> int:
        """What ``generate`` caches for ``tokens`` (prompts and completions of every row generated at once): each
        layer's keys and values, in the weights' dtype."""
        return 2 * self.layers * (self.kv_hidden or self.hidden) * self.weight_bytes * tokens


# a mixture of experts' expert counts (Qwen2/3-MoE, Mixtral, DeepSeek): the estimate counts no experts
EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")


def model_shape(model: ModelSpec) -> Optional[ModelShape]:
    """The shape of the model from its config; None where there is none to read (a hub id out of reach, a
    built-in, a config that is not a decoder's) or it would be wrong (a mixture of experts)."""
    return _shape(model.name_or_path, model.revision, model.trust_remote_code, model.dtype)


@functools.lru_cache(maxsize=8)
def _shape(name_or_path: str, revision: Optional[str], trust_remote_code: bool, dtype: str) -> Optional[ModelShape]:
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(
            name_or_path, revision=revision, trust_remote_code=trust_remote_code
        ).get_text_config()
        if any(getattr(config, count, None) for count in EXPERT_COUNTS):
            return None
        weights = str(config.dtype or "float32") if dtype == "auto" else dtype
        return ModelShape(
            model_type=config.model_type,
            hidden=config.hidden_size,
            intermediate=config.intermediate_size,
            layers=config.num_hidden_layers,
            vocabulary=config.vocab_size,
            tied=bool(getattr(config, "tie_word_embeddings", True)),
            attention_dropout=float(getattr(config, "attention_dropout", 0.0) or 0.0),
            weight_bytes=2 if weights.replace("torch.", "") in ("bfloat16", "float16") else 4,
            kv_hidden=_kv_hidden(config),
        )
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def _kv_hidden(config: object) -> Optional[int]:
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if not heads:
        return None
    head_size = getattr(config, "head_dim", None) or config.hidden_size // heads
    return kv_heads * head_size


def gpu_bytes() -> int:
    """This process's GPU's memory."""
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory


def fits(total_bytes: int) -> bool:
    return total_bytes <= MEMORY_SHARE * gpu_bytes()


# The models docs/pages/gpu-memory.md gives figures for: Qwen2.5's base models, from their configs
DOCUMENTED_SHAPES = {
    "Qwen2.5-0.5B": ModelShape("qwen2", 896, 4864, 24, 151936, True, 0.0, 2, kv_hidden=128),
    "Qwen2.5-1.5B": ModelShape("qwen2", 1536, 8960, 28, 151936, True, 0.0, 2, kv_hidden=256),
    "Qwen2.5-7B": ModelShape("qwen2", 3584, 18944, 28, 152064, False, 0.0, 2, kv_hidden=512),
}
# (what the row says, how the model trains, the strategy, GPUs)
DOCUMENTED_SETUPS: Tuple[Tuple[str, str, str, int], ...] = (
    ("full, 1 GPU (or DDP)", "full", "ddp", 1),
    ("full, ZeRO-2, 8 GPUs", "full", "zero2", 8),
    ("full, ZeRO-3, 8 GPUs", "full", "zero3", 8),
    ("full, FSDP, 8 GPUs", "full", "fsdp", 8),
    ("LoRA, 1 GPU", "lora", "ddp", 1),
    ("QLoRA (4-bit), 1 GPU", "4bit", "ddp", 1),
)
# the row length the activation table is given for
DOCUMENTED_ROW = 1024


def tables() -> str:
    """docs/pages/gpu-memory.md's two tables, in GB (1e9 bytes): the training state per GPU by model and
    setup, and what a row of ``DOCUMENTED_ROW`` tokens adds (in training, and while generating)."""

    def gb(size: float, digits: int = 1) -> str:
        return f"{size / 1e9:.{digits}f}"

    lines: List[str] = [
        "| model | setup | weights, gradients, optimizer per GPU | + DPO's reference |",
        "| --- | --- | ---: | ---: |",
    ]
    for name, shape in DOCUMENTED_SHAPES.items():
        for label, trained, strategy, gpus in DOCUMENTED_SETUPS:
            # LoRA's reference is the policy without its adapter
            reference = 0 if trained != "full" else shape.frozen_bytes(strategy, gpus)
            state = shape.state_bytes(trained, strategy, gpus)
            lines.append(f"| {name} | {label} | {gb(state)} | {gb(reference)} |")
    lines += [
        "",
        f"| model | activations per row of {DOCUMENTED_ROW:,} tokens, checkpointing | without checkpointing "
        "| logits without Liger's fused loss | KV cache while generating |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, shape in DOCUMENTED_SHAPES.items():
        kept, whole = (
            shape.activation_bytes(DOCUMENTED_ROW, checkpointing, half=True) for checkpointing in (True, False)
        )
        logits, cache = shape.logit_bytes(DOCUMENTED_ROW), shape.kv_cache_bytes(DOCUMENTED_ROW)
        # a row's cache is small; a step generates hundreds of rows at once
        lines.append(f"| {name} | {gb(kept)} | {gb(whole)} | {gb(logits)} | {gb(cache, digits=3)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(tables())
