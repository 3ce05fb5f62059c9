"""An evaluation's sampling in vLLM (``generation.engine``: vllm, or auto where vLLM is installed): one model's
completions of a rank's prompts, in a process of its own.

The evaluation job's process runs this program once per model
(``evaluation/sampling.py``: :func:`sample_with_vllm`), outside torchrun's
world: each model gets a fresh engine (vLLM keeps one model's parallel state
per process), on the rank's own GPU, and its memory is given back when it
ends. Each prompt is sampled with its own seed, as the transformers path
samples it, so the samples do not depend on how many processes share the
prompts. With ``--serve`` it writes the turns of an evaluation's episodes
instead, a round at a time, as the evaluation asks (its tools and
environments run in the evaluation's process, between rounds), or the
requests of an agent program's endpoint, each round a batch of them.

    python -m posttrain.entrypoints.vllm_sampler --request request.json --out completions.json
    python -m posttrain.entrypoints.vllm_sampler --request request.json --serve ASKED ANSWERS
"""

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence

from posttrain.components.spec.judging import GenerationSpec
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.sections import ModelSpec
from posttrain.entrypoints.generation.vllm_generation import builtin_directory, head_size_problem, runs_eagerly
from posttrain.entrypoints.inputs import tiny
from posttrain.entrypoints.records.files import write_json_atomic


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m posttrain.entrypoints.vllm_sampler")
    parser.add_argument("--request", type=Path, required=True, help="the model, the settings, the prompts' tokens")
    parser.add_argument("--out", type=Path, help="where each prompt's completions go, as JSON")
    parser.add_argument(
        "--serve",
        type=int,
        nargs=2,
        metavar=("ASKED", "ANSWERS"),
        help="write rounds of turns instead: the file descriptors where each round's number is read, and said back "
        "once its tokens are written (beside --request: engine.json out, then ready said; round-N.json in, "
        "round-N-written.json out)",
    )
    options = parser.parse_args(argv)
    if (options.out is None) == (options.serve is None):
        parser.error("give --out or --serve")
    request = json.loads(options.request.read_text())
    model = ModelSpec.model_validate(request["model"])
    generation = GenerationSpec.model_validate(request["generation"])
    try:
        if options.serve:
            llm = engine(model, generation, request.get("longest"))
            serve(llm, generation, options.request.parent, *options.serve)
            return
        prompts = request["prompts"]
        llm = engine(model, generation, max(len(ids) for ids in prompts) + generation.max_new_tokens)
        completions = sample(llm, generation, prompts, request["seeds"])
    except SpecError as error:
        print(f"posttrain: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    options.out.write_text(json.dumps(completions))


def engine(model: ModelSpec, generation: GenerationSpec, longest: Optional[int]) -> Any:
    """vLLM's engine of ``model``, for sequences of ``longest`` tokens at most (None: as long as the model takes,
    where its memory holds them)."""
    import torch
    from transformers import AutoConfig
    from vllm import LLM

    path = builtin_directory(model) if model.name_or_path in tiny.BUILTINS else model.name_or_path
    config = AutoConfig.from_pretrained(path, revision=model.revision, trust_remote_code=model.trust_remote_code)
    on_cpu = not torch.cuda.is_available()
    problem = head_size_problem(config, on_cpu)
    if problem:
        raise SpecError([problem.replace("model.name_or_path", "models")])
    dtype = model.dtype if model.dtype != "auto" else str(getattr(config, "dtype", None) or "float32")
    # on CPU, a seeded request whose prefill is cut in chunks kills the engine (vLLM rewinds the request's generator,
    # and a CPU generator has no offset to rewind: "CPU Generator does not use offset"): each prefill whole
    prefill = max(longest or config.max_position_embeddings, 8192)
    whole_prefills = {"enable_chunked_prefill": False, "max_num_batched_tokens": prefill} if on_cpu else {}
    return LLM(
        model=path,
        revision=model.revision,
        trust_remote_code=model.trust_remote_code,
        dtype=dtype.removeprefix("torch."),
        seed=0,
        gpu_memory_utilization=generation.vllm_gpu_memory_utilization,
        # unbounded (an endpoint's): as long as the model takes and its memory holds, vLLM fitting it (-1)
        max_model_len=longest or -1,
        # log-probs after the temperature, as the transformers engine gives them (generation/engine.py)
        logprobs_mode="processed_logprobs",
        # the spec's settings only, as the transformers path samples (not the model's generation_config.json)
        generation_config="vllm",
        enforce_eager=runs_eagerly(on_cpu),
        **whole_prefills,
    )


def sample(llm: Any, generation: GenerationSpec, prompts: List[List[int]], seeds: List[int]) -> List[List[str]]:
    """Each prompt's ``generation.num_samples`` completions (token ids in, text out), each from its own seed."""
    from vllm.inputs import TokensPrompt

    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=ids) for ids in prompts],
        [
            sampling(generation, n=generation.num_samples, max_tokens=generation.max_new_tokens, seed=seed)
            for seed in seeds
        ],
        use_tqdm=False,
    )
    return [[completion.text for completion in output.outputs] for output in outputs]


def serve(llm: Any, generation: GenerationSpec, scratch: Path, asked: int, answers: int) -> None:
    """Says its engine's length (engine.json) and that it is ready, then writes each round of turns the evaluation
    asks for (``evaluation/sampling.py``: :func:`_served`): their tokens, up to each turn's end token, and, for a
    turn that samples as it says (an endpoint's request), their log-probs, until the evaluation says ``end`` (or
    closes ``asked``)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    write_json_atomic(scratch / "engine.json", {"max_model_len": llm.llm_engine.model_config.max_model_len})
    os.write(answers, b"ready\n")
    with open(asked) as rounds:
        for line in rounds:
            if line.strip() == "end":
                return
            number = int(line)
            turns = json.loads((scratch / f"round-{number}.json").read_text())
            outputs = llm.generate(
                [TokensPrompt(prompt_token_ids=turn["ids"]) for turn in turns],
                [
                    SamplingParams(**turn["sampling"], max_tokens=turn["budget"], seed=turn["seed"], logprobs=0)
                    if turn.get("sampling")
                    else sampling(generation, n=1, max_tokens=turn["budget"], seed=turn["seed"])
                    for turn in turns
                ],
                use_tqdm=False,
            )
            written = [output.outputs[0] for output in outputs]
            write_json_atomic(
                scratch / f"round-{number}-written.json",
                [
                    {
                        "ids": list(out.token_ids),
                        "logprobs": [step[token].logprob for token, step in zip(out.token_ids, out.logprobs or [])],
                    }
                    for out in written
                ],
            )
            os.write(answers, f"{number}\n".encode())


def sampling(generation: GenerationSpec, **settings: Any) -> Any:
    """vLLM's sampling parameters for the spec's temperature and top-p, and ``settings``."""
    from vllm import SamplingParams

    if generation.temperature == 0:
        return SamplingParams(temperature=0.0, **settings)
    return SamplingParams(temperature=generation.temperature, top_p=generation.top_p, **settings)


if __name__ == "__main__":
    main()
