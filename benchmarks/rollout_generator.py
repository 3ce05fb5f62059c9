"""The rollout generator against transformers' ``generate`` at the same shape (entrypoints/speed/rollout_generator.py).

``python -m benchmarks.rollout_generator [--gpu] [--repeats 3] [--workloads spread full]`` samples one RL step's completions both ways, on
Qwen2.5-0.5B's shape with random weights (``workload.GPU_SHAPES``; fp32 on CPU, bf16 with ``--gpu``), interleaved
(generate, rollout, generate, ...), the same seed for both sides of a repeat. Two workloads:

- ``spread``: rows end at an end token, drawn as RL's completions end, some early, some at the limit: a random
  share of the vocabulary (1/32 of it: the random model samples near uniformly) ends a row, so the lengths spread
  from 1 to the limit (about ``max_new_tokens``/2 on average);
- ``full``: nothing ends a row; every row writes to the limit, where the rollout generator drops no row.

Per run: seconds, completion tokens (each row's up to its end token), and completion tokens per second; medians
per side and workload, and rollout/generate's ratios: of the seconds a step's rollouts take (the two sides' draws
part once rows leave the batch, so their lengths differ a little: the same distribution), and of tokens/s. CPU: 16 rows (2 completions of 8 prompts of 64 tokens), up to
64 tokens. ``--gpu``: GRPO's GSM8K-like step of BENCHMARKS.md, 256 rows (8 completions of 32 prompts of 200
tokens), up to 512 tokens.
"""

import argparse
import json
import statistics
import time
from typing import Dict, List, Optional

import torch

from benchmarks import workload

SIDES = ("generate", "rollout")
WORKLOADS = ("spread", "full")
# (prompts, completions per prompt, prompt tokens, max new tokens)
SHAPES = {"cpu": (8, 2, 64, 64), "gpu": (32, 8, 200, 512)}
# the share of the vocabulary that ends a row in the spread workload
ENDING_SHARE = 32


def build_model(device: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(max_position_embeddings=4096, pad_token_id=0, eos_token_id=1, **workload.GPU_SHAPES["0.5b"])
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def run(model: torch.nn.Module, side: str, ends: Optional[List[int]], shape: tuple, seed: int) -> Dict[str, float]:
    from transformers import GenerationConfig

    from posttrain.entrypoints.speed import rollout_generator

    prompts, per_prompt, prompt_tokens, max_new = shape
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, model.config.vocab_size, (prompts, prompt_tokens), generator=generator)
    ids = ids.repeat_interleave(per_prompt, 0).to(device)
    mask = torch.ones_like(ids)
    config = GenerationConfig(
        max_new_tokens=max_new, do_sample=True, temperature=1.0, top_k=0, eos_token_id=ends, pad_token_id=0
    )
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.no_grad():
        if side == "generate":
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        else:
            out = rollout_generator.generate(model, ids, mask, model._prepare_generation_config(config)[0])
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    written = out[:, prompt_tokens:]
    if ends:
        ended = torch.isin(written, torch.tensor(ends, device=device))
        lengths = torch.where(ended.any(1), ended.int().argmax(1) + 1, written.shape[1])
    else:
        lengths = torch.full((len(written),), written.shape[1])
    tokens = int(lengths.sum())
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rollout_generator", description=__doc__)
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--json", help="write the runs and medians here")
    options = parser.parse_args(argv)
    device = "cuda" if options.gpu else "cpu"
    shape = SHAPES[device if device == "cpu" else "gpu"]
    model = build_model(device)
    vocabulary = torch.randperm(model.config.vocab_size, generator=torch.Generator().manual_seed(1))
    endings = {"spread": sorted(vocabulary[: model.config.vocab_size // ENDING_SHARE].tolist()), "full": None}
    prompts, per_prompt, prompt_tokens, max_new = shape
    print(
        f"Qwen2.5-0.5B's shape on {device} ({torch.get_num_threads()} threads): {prompts} prompts x {per_prompt} "
        f"completions, prompts of {prompt_tokens} tokens, up to {max_new} new",
        flush=True,
    )
    # a warm-up of each side, not counted
    for side in SIDES:
        run(model, side, endings["spread"], (1, 2, 8, 4), seed=0)
    runs: Dict[str, List[Dict[str, float]]] = {f"{w} {s}": [] for w in options.workloads for s in SIDES}
    for repeat in range(options.repeats):
        for name in options.workloads:
            for side in SIDES:
                figures = run(model, side, endings[name], shape, seed=100 + repeat)
                runs[f"{name} {side}"].append(figures)
                print(
                    f"{name} {side} {repeat}: " + json.dumps({k: round(v, 2) for k, v in figures.items()}), flush=True
                )
    medians = {key: {k: statistics.median(r[k] for r in found) for k in found[0]} for key, found in runs.items()}
    print("| workload | side | seconds | completion tokens | tokens/s |\n| --- | --- | ---: | ---: | ---: |")
    for key, figures in medians.items():
        name, side = key.split()
        print(
            f"| {name} | {side} | {figures['seconds']:.2f} | {figures['tokens']:.0f} | {figures['tokens_per_s']:,.0f} |"
        )
    for name in options.workloads:
        rollout, generate = medians[f"{name} rollout"], medians[f"{name} generate"]
        speedup = generate["seconds"] / rollout["seconds"]
        ratio = rollout["tokens_per_s"] / generate["tokens_per_s"]
        print(f"{name}: rollout / generate: the step's rollouts {speedup:.2f}x as fast, tokens/s {ratio:.2f}x")
    if options.json:
        with open(options.json, "w") as out:
            json.dump({"device": device, "shape": shape, "runs": runs, "medians": medians}, out, indent=1)


if __name__ == "__main__":
    main()
