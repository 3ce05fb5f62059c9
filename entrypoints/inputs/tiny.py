"""The built-in tiny models: random Llamas and their tokenizers, built offline.

For smoke runs and tests on CPU: byte-level BPE tokenizers trained on a fixed
corpus and 2-layer Llamas initialised from a fixed seed. Every rank builds the
same model, in well under a second, with no download.

- ``builtin:tiny-llama``: friendly on purpose (ChatML, pad token id 0, no
  BOS, no dropout, neutral generation settings).
- ``builtin:tiny-llama3``: shaped like a real instruct model, so tests see
  what real ones do: id 0 is an ordinary token (``!``, as in GPT-2, Llama 3
  and Qwen) and the special tokens come last; a BOS token the tokenizer adds
  to plain text and the chat template writes; no pad token (the job pads with
  EOS, as for Llama 3); attention dropout in the config; and a generation
  config with an instruct model's sampling defaults (temperature, top-p,
  top-k, repetition penalty).
- ``builtin:tiny-llama3-vllm``: ``tiny-llama3`` with 2 heads of 32 (1 KV
  head) instead of 4 of 16, the same weights: vLLM's CPU attention needs a
  head size of 32 or more.
- ``builtin:tiny-tools``: a model that can call tools. Qwen2.5's chat template,
  verbatim (TRL reads tool calls back only from templates it knows), with its
  special and tool tokens; its tokenizer learnt from conversations with a tool
  as that template renders them, so a prompt with a tool fits in a few hundred
  tokens; 1024 positions; 2 heads of 32, so vLLM runs it on CPU too; weights drawn wider, so it learns to read
  a tool's result.
"""

import functools
import itertools
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Tuple, Type

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, LlamaConfig, PreTrainedModel, PreTrainedTokenizerFast

NAME = "builtin:tiny-llama"
NAME_LLAMA3 = "builtin:tiny-llama3"
NAME_LLAMA3_VLLM = "builtin:tiny-llama3-vllm"
NAME_TOOLS = "builtin:tiny-tools"

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


def _train_bpe(vocab_size: int, special_tokens: list, corpus: Optional[Iterable[str]] = None) -> Tokenizer:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus() if corpus is None else corpus, trainer)
    return bpe


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (vocabulary of 512) with the ChatML template."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_bpe(512, [PAD, EOS, IM_START]),
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
    return _seeded_llama(model_class, tokenizer, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)


def _seeded_llama(
    model_class: Type[PreTrainedModel], tokenizer: PreTrainedTokenizerFast, **config: Any
) -> PreTrainedModel:
    """The 2-layer Llama the built-ins share, sized to the tokenizer, initialised from seed 0; ``config`` wins."""
    shape = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    llama = LlamaConfig(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
        num_labels=1,
        **{**shape, **config},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return model_class(llama)


BOS3, EOT3, HEADER_START, HEADER_END = "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"

# Llama 3's chat template, shortened: the BOS token opens every conversation.
CHAT_TEMPLATE_LLAMA3 = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def build_tokenizer_llama3() -> PreTrainedTokenizerFast:
    """Byte-level BPE (512 tokens) whose special tokens come last, with a BOS added to plain text."""
    # the 4 special tokens are added after: the last ids, as in Llama 3
    bpe = _train_bpe(508, [])
    bpe.add_special_tokens([BOS3, EOT3, HEADER_START, HEADER_END])
    bpe.post_processor = processors.TemplateProcessing(
        single=f"{BOS3} $A", pair=f"{BOS3} $A {BOS3} $B", special_tokens=[(BOS3, bpe.token_to_id(BOS3))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=BOS3, eos_token=EOT3, chat_template=CHAT_TEMPLATE_LLAMA3
    )


def build_model_llama3(
    tokenizer: PreTrainedTokenizerFast, model_class: Type[PreTrainedModel], **shape: Any
) -> PreTrainedModel:
    """The 2-layer Llama of :func:`build_model`, with attention dropout and an instruct model's sampling defaults."""
    model = _seeded_llama(
        model_class, tokenizer, attention_dropout=0.1, bos_token_id=tokenizer.bos_token_id, pad_token_id=None, **shape
    )
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        do_sample=True,
        temperature=0.6,
        top_p=0.9,
        top_k=20,
        repetition_penalty=1.3,
    )
    return model


TOOL_PAD, TOOL_TOKENS = "<|endoftext|>", ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
# a tool as the model sees it (transformers' JSON schema of a function), for the tokenizer's corpus
_LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "The value stored under a key.",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string", "description": "The key to look up."}},
            "required": ["key"],
        },
    },
}


def _tool_corpus(chat_template: str) -> Iterator[str]:
    """Conversations with a tool as ``chat_template`` renders them (preamble, call, result, answer), special and
    tool tokens left out: learnt often enough that each becomes a few tokens."""
    renderer = build_tokenizer()
    renderer.chat_template = chat_template
    for word, value in zip(_WORDS, _WORDS[::-1]):
        conversation = [
            {"role": "user", "content": f"What is the value of {word}?"},
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": {"key": word}}}],
            },
            {"role": "tool", "name": "lookup", "content": value},
            {"role": "assistant", "content": value},
        ]
        text = renderer.apply_chat_template(conversation, tools=[_LOOKUP], tokenize=False)
        for token in (IM_START, EOS, *TOOL_TOKENS):
            text = text.replace(token, "\n")
        yield text


def build_tokenizer_tools() -> PreTrainedTokenizerFast:
    """Byte-level BPE (512 tokens) with Qwen2.5's chat template and tokens: its special tokens, then the tool-call
    and tool-response tags, last."""
    from trl.chat_template_utils import qwen2_5_chat_template

    corpus = itertools.chain(_corpus(), _tool_corpus(qwen2_5_chat_template))
    bpe = _train_bpe(512 - 3 - len(TOOL_TOKENS), [], corpus)
    bpe.add_special_tokens([TOOL_PAD, IM_START, EOS])
    # ordinary added tokens, as Qwen2.5's: whole, and kept when special tokens are skipped
    bpe.add_tokens(list(TOOL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=EOS, pad_token=TOOL_PAD, chat_template=qwen2_5_chat_template
    )


def build_model_tools(tokenizer: PreTrainedTokenizerFast, model_class: Type[PreTrainedModel]) -> PreTrainedModel:
    """The 2-layer Llama of :func:`build_model` with 1024 positions (a tool's preamble, calls and results), 2 heads
    of 32 (vLLM's CPU attention takes 32 and up) and weights drawn 5x wider: with the default 0.02, copying a
    tool's result from behind a 200-token preamble stays at chance through 1200 SFT steps; with 0.1 it is learnt
    in 400."""
    return _seeded_llama(
        model_class,
        tokenizer,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        max_position_embeddings=1024,
        num_attention_heads=2,
        num_key_value_heads=1,
        initializer_range=0.1,
    )


# name -> (tokenizer builder, model builder)
BUILTINS: Dict[str, Tuple[Callable[[], PreTrainedTokenizerFast], Callable[..., PreTrainedModel]]] = {
    NAME: (build_tokenizer, build_model),
    NAME_LLAMA3: (build_tokenizer_llama3, build_model_llama3),
    # the same weight shapes (2 x 32 = 4 x 16; 1 KV head of 32 = 2 of 16), so the same seeded weights
    NAME_LLAMA3_VLLM: (
        build_tokenizer_llama3,
        functools.partial(build_model_llama3, num_attention_heads=2, num_key_value_heads=1),
    ),
    NAME_TOOLS: (build_tokenizer_tools, build_model_tools),
}
