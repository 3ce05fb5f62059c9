"""What the job's OpenAI-compatible endpoint (``endpoint.py``) asks of a generation engine, and the engine over
transformers' ``generate``: a batch of token-in requests in, each one's sampled tokens and their log-probs out.

The log-probs are of softmax(logits / temperature), the distribution the
tokens were drawn from (the cuts of top-p, top-k and min-p and a repetition
penalty aside), computed as TRL's trainers compute their own, so that a trainer
can weigh what was sampled against what it trains.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch

from posttrain.entrypoints.generation.sampling import sampling_from_the_logits


@dataclasses.dataclass(frozen=True)
class Request:
    """One completion asked for: the prompt's tokens, the most tokens it may write, how to sample, where it stops
    (the stop tokens written are kept, as the model wrote them)."""

    prompt_ids: Tuple[int, ...]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    # 0: no cut; vLLM's extra sampling parameters, as an agent's client sends them (extra_body)
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: Tuple[int, ...] = ()

    def sampling(self) -> Tuple[float, float, int, float, float]:
        """How it samples: requests that sample alike are generated in one batch."""
        return (self.temperature, self.top_p, self.top_k, self.min_p, self.repetition_penalty)


@dataclasses.dataclass(frozen=True)
class Completion:
    """What one request wrote: its tokens, each token's log-prob, and why it ended (``stop`` or ``length``)."""

    ids: List[int]
    logprobs: List[float]
    finish_reason: str


# an engine: a batch of requests in, what each wrote out, in order
Engine = Callable[[Sequence[Request]], List[Completion]]


def end_tokens(generation_config: Any, tokenizer: Any) -> List[int]:
    """Where the model's turn ends: its generation config's end tokens (None: it has none) and its tokenizer's."""
    ends = generation_config.eos_token_id if generation_config is not None else None
    ends = ends if isinstance(ends, list) else [] if ends is None else [ends]
    return sorted(set(ends) | {tokenizer.eos_token_id})


def ended(request: Request, ids: List[int], logprobs: List[float]) -> Completion:
    """``ids`` (at least as many as the request may write, unless the model ended) cut at its first stop token, kept,
    or at its ``max_tokens``."""
    ids = ids[: request.max_tokens]
    stop = next((index for index, token in enumerate(ids) if token in request.stop_token_ids), None)
    if stop is None:
        return Completion(ids, logprobs[: len(ids)], "length")
    return Completion(ids[: stop + 1], logprobs[: stop + 1], "stop")


def transformers_engine(model: Any, tokenizer: Any) -> Engine:
    """An engine over ``model.generate``: the requests that sample alike in one left-padded batch, sampling from
    the logits alone (``sampling_from_the_logits``), each cut at its stop tokens and its ``max_tokens``."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @torch.no_grad()
    def generate(requests: Sequence[Request]) -> List[Completion]:
        alike: Dict[Tuple[float, float, int, float, float], List[int]] = {}
        for index, request in enumerate(requests):
            alike.setdefault(request.sampling(), []).append(index)
        completions: Dict[int, Completion] = {}
        for indices in alike.values():
            batch = [requests[index] for index in indices]
            for index, (ids, logprobs) in zip(indices, _generated(model, pad, batch)):
                completions[index] = ended(requests[index], ids, logprobs)
        return [completions[index] for index in range(len(requests))]

    return generate


def _generated(model: Any, pad: int, batch: List[Request]) -> List[Tuple[List[int], List[float]]]:
    """The tokens each request of ``batch`` (all sampling alike) wrote, and their log-probs."""
    longest = max(len(request.prompt_ids) for request in batch)
    input_ids = torch.tensor([[pad] * (longest - len(r.prompt_ids)) + list(r.prompt_ids) for r in batch])
    attention_mask = torch.tensor([[0] * (longest - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in batch])
    temperature, top_p, top_k, min_p, repetition_penalty = batch[0].sampling()
    settings: Dict[str, Any] = {"do_sample": False, "repetition_penalty": repetition_penalty}
    if temperature != 0:
        settings.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p or None)
    with sampling_from_the_logits(model):
        generated = model.generate(
            input_ids=input_ids.to(model.device),
            attention_mask=attention_mask.to(model.device),
            # a shorter prompt's longer budget stops where the longest prompt reaches the model's length
            max_new_tokens=min(
                max(request.max_tokens for request in batch), model.config.max_position_embeddings - longest
            ),
            pad_token_id=pad,
            output_logits=True,
            return_dict_in_generate=True,
            use_cache=True,
            **settings,
        )
    new = generated.sequences[:, longest:]
    scaled = torch.stack(generated.logits, dim=1).float() / (temperature or 1.0)
    logprobs = torch.log_softmax(scaled, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    return [(new[row].tolist(), logprobs[row].tolist()) for row in range(len(batch))]
