"""An evaluation's sampling in vLLM (``generation.engine``: vllm, or auto where vLLM is installed): one model's
completions of a rank's prompts, in a process of its own.

The evaluation job's process runs this program once per model
(``evaluation/sampling.py``: :func:`sample_with_vllm`), outside torchrun's
world: each model gets a fresh engine (vLLM keeps one model's parallel state
per process), on the rank's own GPU, and its memory is given back when it
ends. Each prompt is sampled with its own seed, as the transformers path
samples it, so the samples do not depend on how many processes share the
prompts.

    python -m posttrain.entrypoints.vllm_sampler --request request.json --out completions.json
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from posttrain.components.spec.judging import GenerationSpec
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.sections import ModelSpec
from posttrain.entrypoints.generation.vllm_generation import builtin_directory, head_size_problem, runs_eagerly
from posttrain.entrypoints.inputs import tiny


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m posttrain.entrypoints.vllm_sampler")
    parser.add_argument("--request", type=Path, required=True, help="the model, the settings, the prompts' tokens")
    parser.add_argument("--out", type=Path, required=True, help="where each prompt's completions go, as JSON")
    options = parser.parse_args(argv)
    request = json.loads(options.request.read_text())
    try:
        completions = sample(
            ModelSpec.model_validate(request["model"]),
            GenerationSpec.model_validate(request["generation"]),
            request["prompts"],
            request["seeds"],
        )
    except SpecError as error:
        print(f"posttrain: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    options.out.write_text(json.dumps(completions))


def sample(model: ModelSpec, generation: GenerationSpec, prompts: List[List[int]], seeds: List[int]) -> List[List[str]]:
    """Each prompt's ``generation.num_samples`` completions (token ids in, text out), each from its own seed."""
    import torch
    from transformers import AutoConfig
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    path = builtin_directory(model) if model.name_or_path in tiny.BUILTINS else model.name_or_path
    config = AutoConfig.from_pretrained(path, revision=model.revision, trust_remote_code=model.trust_remote_code)
    on_cpu = not torch.cuda.is_available()
    problem = head_size_problem(config, on_cpu)
    if problem:
        raise SpecError([problem.replace("model.name_or_path", "models")])
    dtype = model.dtype if model.dtype != "auto" else str(getattr(config, "dtype", None) or "float32")
    llm = LLM(
        model=path,
        revision=model.revision,
        trust_remote_code=model.trust_remote_code,
        dtype=dtype.removeprefix("torch."),
        seed=0,
        gpu_memory_utilization=generation.vllm_gpu_memory_utilization,
        max_model_len=max(len(ids) for ids in prompts) + generation.max_new_tokens,
        # the spec's settings only, as the transformers path samples (not the model's generation_config.json)
        generation_config="vllm",
        enforce_eager=runs_eagerly(on_cpu),
    )
    settings: Dict[str, Any] = {"n": generation.num_samples, "max_tokens": generation.max_new_tokens}
    if generation.temperature == 0:
        settings["temperature"] = 0.0
    else:
        settings.update(temperature=generation.temperature, top_p=generation.top_p)
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=ids) for ids in prompts],
        [SamplingParams(**settings, seed=seed) for seed in seeds],
        use_tqdm=False,
    )
    return [[completion.text for completion in output.outputs] for output in outputs]


if __name__ == "__main__":
    main()
