"""What the benchmarks train: a model of realistic shape, scaled down, and synthetic data with a real length spread.

Built offline and deterministically, written to disk once, and loaded the
same way by both sides (``from_pretrained`` and ``load_dataset("json")``):

- a byte-level BPE tokenizer trained on the synthetic text (vocabulary 8,192,
  ChatML template, its own pad token);
- a Llama: on CPU 4 layers, hidden 256, 8 heads of 32, grouped KV (about
  4.9M parameters); on GPUs Qwen2.5-0.5B's shape (24 layers, hidden 896,
  vocabulary 151,936: about 0.49B parameters) or Qwen2.5-1.5B's (28 layers,
  hidden 1,536: about 1.5B), random weights, bf16;
- chat rows whose answers have log-normal lengths (median 60 words, 5 to 300
  on CPU, 4 times longer on GPU): tens to hundreds of tokens with a long tail,
  as instruction data has; preference rows with two answers of independent
  lengths; prompts alone for GRPO.
"""

import json
import math
import random
from pathlib import Path
from typing import Dict, Iterator, List, Optional

CPU_SHAPE = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    tie_word_embeddings=True,
)
# Qwen2.5's
GPU_SHAPES = {
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        vocab_size=151936,
    ),
    "1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        vocab_size=151936,
    ),
}


def _words(rng: random.Random, count: int) -> List[str]:
    """A vocabulary of pronounceable pseudo-words."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = set()
    while len(words) < count:
        words.add("".join(rng.choice(syllables) for _ in range(rng.choice((1, 2, 2, 3, 3, 4)))))
    return sorted(words)


class TextSource:
    """Zipf-distributed pseudo-words, as a natural language's frequencies are."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.words = _words(self.rng, 4000)
        self.weights = [1.0 / (rank + 1) for rank in range(len(self.words))]

    def text(self, n_words: int) -> str:
        words = self.rng.choices(self.words, weights=self.weights, k=n_words)
        return " ".join(words).capitalize() + "."

    def answer_length(self, scale: int) -> int:
        """Words in an answer: log-normal, median 60, clipped to 5..300 (times ``scale``)."""
        return scale * min(300, max(5, round(math.exp(self.rng.gauss(math.log(60), 0.8)))))


def chat_rows(n: int, seed: int = 0, scale: int = 1) -> Iterator[Dict]:
    source = TextSource(seed)
    for _ in range(n):
        prompt = source.text(source.rng.randint(5, 40))
        yield {
            "messages": [
                {"role": "user", "content": prompt},
                {"role": "assistant", "content": source.text(source.answer_length(scale))},
            ]
        }


def preference_rows(n: int, seed: int = 0, scale: int = 1) -> Iterator[Dict]:
    source = TextSource(seed)
    for _ in range(n):
        prompt = source.text(source.rng.randint(5, 40))
        yield {
            "prompt": [{"role": "user", "content": prompt}],
            "chosen": [{"role": "assistant", "content": source.text(source.answer_length(scale))}],
            "rejected": [{"role": "assistant", "content": source.text(source.answer_length(scale))}],
        }


def prompt_rows(n: int, seed: int = 0, scale: int = 1) -> Iterator[Dict]:
    """Chat prompts alone, for the algorithms that generate their completions (GRPO)."""
    source = TextSource(seed)
    for _ in range(n):
        yield {"prompt": [{"role": "user", "content": source.text(scale * source.rng.randint(5, 40))}]}


def write_rows(path: Path, rows: Iterator[Dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as file:
        for row in rows:
            file.write(json.dumps(row) + "\n")
    return path


def build_model_dir(path: Path, gpu_shape: Optional[str] = None) -> Path:
    """Writes the tokenizer and a randomly initialised Llama (seed 0) to ``path``; returns it. ``gpu_shape``: one of
    ``GPU_SHAPES``, in bf16; else the CPU's small one."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    # ChatML with generation marks, as the tiny models'
    from posttrain.entrypoints.inputs.tiny import CHAT_TEMPLATE

    if (path / "config.json").is_file():
        return path
    special = ["<|pad|>", "<|im_end|>", "<|im_start|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    source = TextSource(seed=1)
    corpus = (source.text(source.answer_length(1)) for _ in range(3000))
    trainer = trainers.BpeTrainer(
        vocab_size=8192,
        special_tokens=special,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token=special[0], eos_token=special[1], chat_template=CHAT_TEMPLATE
    )
    shape = dict(CPU_SHAPE if gpu_shape is None else GPU_SHAPES[gpu_shape])
    shape.setdefault("vocab_size", len(tokenizer))
    config = LlamaConfig(
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        **shape,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32 if gpu_shape is None else torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def parameter_count(path: Path) -> int:
    """Parameters of the model in ``path`` (tied embeddings counted once), from its config."""
    config = json.loads((path / "config.json").read_text())
    h, i, n, v = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"], config["vocab_size"]
    head_dim = h // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
    return v * h * (1 if config.get("tie_word_embeddings") else 2) + n * per_layer + h
