"""The job endpoint's engine over vLLM (``training.use_vllm`` with an agent program): TRL's colocated engine, or the
job's ``vllm`` role through TRL's client.

TRL pushes the policy's weights into either before each step's rollouts, as
for its own generation; the endpoint's requests go to vLLM as token ids, and
what comes back is what vLLM sampled: its ids, and each one's log-prob as TRL's
vLLM generation reads them (``processed_logprobs``: after the temperature),
which TRL's importance-sampling correction weighs against the trainer's. Each
process calls on its own, as its episodes call: a colocated engine is the
process's own; the role is shared, each process with a client of its own
(TRL gives rank 0 the only one).
"""

import time
from typing import Any, Dict, List, Sequence, Tuple

from posttrain.entrypoints.generation.engine import Completion, Engine, Request, ended
from posttrain.entrypoints.generation.vllm_generation import count_generated


def vllm_engine(generation: Any) -> Tuple[Engine, int]:
    """An engine over TRL's vLLM (``generation``: TRL's ``VLLMGeneration``), colocated or the server, and the
    longest sequence it takes."""
    return colocated_engine(generation) if generation.mode == "colocate" else server_engine(generation)


def colocated_engine(generation: Any) -> Tuple[Engine, int]:
    """An engine over TRL's colocated ``LLM``, and its model length."""
    from vllm import SamplingParams

    llm = generation.llm

    def generate(requests: Sequence[Request]) -> List[Completion]:
        started = time.perf_counter()
        outputs = llm.generate(
            [{"prompt_token_ids": list(request.prompt_ids)} for request in requests],
            [SamplingParams(**vllm_sampling(request), logprobs=0) for request in requests],
            use_tqdm=False,
        )
        written = [output.outputs[0] for output in outputs]
        count_generated(generation, time.perf_counter() - started, [list(output.token_ids) for output in written])
        return [
            ended(
                request, list(out.token_ids), [step[token].logprob for token, step in zip(out.token_ids, out.logprobs)]
            )
            for request, out in zip(requests, written)
        ]

    return generate, llm.llm_engine.model_config.max_model_len


def server_engine(generation: Any) -> Tuple[Engine, int]:
    """An engine over the vLLM server TRL's ``generation`` talks to (the job's role), and its model length."""
    from trl.generation.vllm_client import VLLMClient

    client = getattr(generation, "vllm_client", None)
    if client is None:
        base_url = generation.server_base_url or f"http://{generation.server_host}:{generation.server_port}"
        client = VLLMClient(base_url=base_url, connection_timeout=generation.server_timeout)

    def generate(requests: Sequence[Request]) -> List[Completion]:
        started = time.perf_counter()
        # one request to the server for the requests that ask alike
        alike: Dict[Tuple[Any, ...], List[int]] = {}
        for index, request in enumerate(requests):
            alike.setdefault((request.sampling(), request.max_tokens, request.stop_token_ids), []).append(index)
        completions: Dict[int, Completion] = {}
        for indices in alike.values():
            settings = vllm_sampling(requests[indices[0]])
            stops = {"stop_token_ids": settings.pop("stop_token_ids")}
            output = client.generate(
                [list(requests[index].prompt_ids) for index in indices], **settings, logprobs=0, generation_kwargs=stops
            )
            for index, ids, logprobs in zip(indices, output["completion_ids"], output["logprobs"]):
                completions[index] = ended(requests[index], list(ids), [top[0] for top in logprobs])
        count_generated(generation, time.perf_counter() - started, [c.ids for c in completions.values()])
        return [completions[index] for index in range(len(requests))]

    model = client._get(f"{client.base_url}/v1/models")["data"][0]
    return generate, model["max_model_len"]


def vllm_sampling(request: Request) -> Dict[str, Any]:
    """vLLM's sampling parameters of ``request``."""
    return {
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
        "min_p": request.min_p,
        "repetition_penalty": request.repetition_penalty,
        "max_tokens": request.max_tokens,
        "stop_token_ids": list(request.stop_token_ids),
    }
