"""How much of a GPU an SFT step takes: the estimate behind the GPU batch and checkpointing defaults (fast_paths).

A step's worst case is every row ``max_length`` tokens long. It holds the
training state (the weights, their gradients and AdamW's two moments, each in
the weights' dtype, as torch's AdamW keeps them), the activations the
backward needs (all of them, or with activation checkpointing each layer's
input and one layer's worth recomputed), and, without Liger's fused loss, the
logits (bf16, their float32 copy for the loss, and its gradient). It fits
where that total is within ``MEMORY_SHARE`` of the GPU's memory.
"""

import dataclasses
import functools
from typing import Optional

import torch

from posttrain.components.spec.schema import ModelSpec

# What a decoder layer keeps for its backward, per token, in bytes at 16 bits: about 16 x hidden (norms, the
# attention's inputs and output) and 6 x intermediate (the gated MLP's three products), as Korthikanti et al.
# count them (2022, "Reducing Activation Recomputation in Large Transformer Models": 34 x hidden for a classic
# MLP), less the scores flash-style kernels never keep.
ACTIVATION_BYTES_PER_HIDDEN, ACTIVATION_BYTES_PER_INTERMEDIATE = 16, 6
# bf16 logits, their float32 copy in the loss, and its gradient
LOGIT_BYTES = 2 + 4 + 4
# of the GPU's memory: what allocator fragmentation and the kernels' workspaces leave
MEMORY_SHARE = 0.9


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

    @property
    def parameters(self) -> int:
        """Attention and MLP weights of every layer, and the embedding (twice where the output layer is its own);
        grouped KV heads counted as full ones: an estimate that errs large."""
        layers = self.layers * (4 * self.hidden * self.hidden + 3 * self.hidden * self.intermediate)
        return layers + self.vocabulary * self.hidden * (1 if self.tied else 2)

    def state_bytes(self) -> int:
        return 4 * self.weight_bytes * self.parameters

    def activation_bytes(self, tokens: int, checkpointing: bool, half: bool) -> int:
        layer = ACTIVATION_BYTES_PER_HIDDEN * self.hidden + ACTIVATION_BYTES_PER_INTERMEDIATE * self.intermediate
        kept = self.layers * 2 * self.hidden + layer if checkpointing else self.layers * layer
        return (1 if half else 2) * kept * tokens

    def logit_bytes(self, tokens: int) -> int:
        return LOGIT_BYTES * self.vocabulary * tokens


def model_shape(model: ModelSpec) -> Optional[ModelShape]:
    """The shape of the model from its config; None where there is none to read (a hub id out of reach, a
    built-in, a config that is not a decoder's)."""
    return _shape(model.name_or_path, model.revision, model.trust_remote_code, model.dtype)


@functools.lru_cache(maxsize=8)
def _shape(name_or_path: str, revision: Optional[str], trust_remote_code: bool, dtype: str) -> Optional[ModelShape]:
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(
            name_or_path, revision=revision, trust_remote_code=trust_remote_code
        ).get_text_config()
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
        )
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def gpu_bytes() -> int:
    """This process's GPU's memory."""
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory


def fits(total_bytes: int) -> bool:
    return total_bytes <= MEMORY_SHARE * gpu_bytes()
