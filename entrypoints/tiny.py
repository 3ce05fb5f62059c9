"""``builtin:tiny-llama``: a tiny random Llama and its tokenizer, built offline.

For smoke runs and tests on CPU: a byte-level BPE tokenizer trained on a
fixed corpus, with a ChatML chat template, and a 2-layer Llama initialised
from a fixed seed. Every rank builds the same model, in well under a second,
with no download.
"""

import itertools
from typing import Iterator, Type

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, PreTrainedModel, PreTrainedTokenizerFast

NAME = "builtin:tiny-llama"

PAD, EOS, IM_START = "<|pad|>", "<|im_end|>", "<|im_start|>"

# ChatML; {% generation %} marks what the assistant says, for assistant-only losses.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}"
    "{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_WORDS = (
    "the a an is are was be to of and in on at for with what which who how many much "
    "plus minus times equals number answer question yes no color red green blue yellow "
    "sky grass sun sea apple banana cherry sweet sour good bad great bright dark happy "
    "capital city country france paris italy rome spain madrid japan tokyo egypt cairo "
    "please say word repeat after me reverse list first last name hello thanks user assistant system"
).split()
_NUMBERS = [str(n) for n in range(0, 41)]


def _corpus() -> Iterator[str]:
    """A fixed corpus so the merges (and the vocabulary) never change."""
    for a, b in itertools.product(_NUMBERS[:21], repeat=2):
        yield f"What is {a} plus {b}? {a} plus {b} is {int(a) + int(b)}."
    for i, word in enumerate(_WORDS):
        following = " ".join(_WORDS[i : i + 6])
        yield f"{word.capitalize()} {following}. The {word} is {following}?"


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (vocabulary of 512) with the ChatML template."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=[PAD, EOS, IM_START],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
    )
    return tokenizer


def build_model(tokenizer: PreTrainedTokenizerFast, model_class: Type[PreTrainedModel]) -> PreTrainedModel:
    """A 2-layer Llama (about 0.1M parameters) sized to the tokenizer, from seed 0.

    ``model_class`` picks the head: a causal LM, or sequence classification
    with one label for reward models.
    """
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        num_labels=1,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = model_class(config)
    return model
