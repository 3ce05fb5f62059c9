"""Sampling a prompt's completions the same way on any number of processes: from a seed of the prompt's own, with
the spec's settings only; in transformers one prompt at a time (no padding), or in vLLM, a process of its own per
model (entrypoints/vllm_sampler.py), where the job's environment has it."""

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, List

import psutil
import torch

from posttrain.components.spec.judging import GenerationSpec
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.sections import ModelSpec
from posttrain.entrypoints.generation.sampling import prompt_ids, sampling_from_the_logits

# a prompt's seed: the spec's, then its place in the data (each model draws with the same seeds: paired samples)
SEED_STRIDE = 1_000_003


# torchrun's variables, which the vLLM process must not see: it is a world of its own
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")
TORCHRUN_VARIABLES += ("ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")


def prompt_seed(generation: GenerationSpec, index: int) -> int:
    return generation.seed * SEED_STRIDE + index


def engine(generation: GenerationSpec, agentic: bool = False) -> str:
    """What samples: the spec's engine, auto being vLLM where the job's environment has it (transformers for
    episodes: ``agentic``, which vLLM does not play yet)."""
    installed = importlib.util.find_spec("vllm") is not None
    if generation.engine == "vllm" and not installed:
        raise SpecError(
            [
                "generation.engine: vllm is not installed in the job's environment (README: Generating with vLLM); "
                "use engine: transformers, or auto"
            ]
        )
    if generation.engine == "auto":
        return "vllm" if installed and not agentic else "transformers"
    return generation.engine


def sample_with_vllm(
    model: ModelSpec, prompts: List[List[int]], seeds: List[int], generation: GenerationSpec
) -> List[List[str]]:
    """Each prompt's completions (its tokens, its seed) from vLLM, in a process of its own on this rank's GPU; past
    ``generation.vllm_timeout_s`` it is killed with its engine, and this rank stops in one line naming the model."""
    env = {key: value for key, value in os.environ.items() if key not in TORCHRUN_VARIABLES}
    env = {key: value for key, value in env.items() if not key.startswith("TORCHELASTIC_")}
    if torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        device = torch.cuda.current_device()
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[device] if visible else str(device)
    with tempfile.TemporaryDirectory(prefix="posttrain-vllm-sampling-") as scratch:
        request, out = Path(scratch) / "request.json", Path(scratch) / "completions.json"
        request.write_text(
            json.dumps(
                {
                    "model": model.model_dump(mode="json"),
                    "generation": generation.model_dump(mode="json"),
                    "prompts": prompts,
                    "seeds": seeds,
                }
            )
        )
        command = [sys.executable, "-m", "posttrain.entrypoints.vllm_sampler", "--request", str(request)]
        # in this process's group, not a session of its own: torchrun, stopping the job, signals the group, and a
        # sampler out of it (its engine's processes with it) would outlive the job, holding the GPU
        sampler = subprocess.Popen([*command, "--out", str(out)], env=env, stderr=subprocess.PIPE, text=True)
        try:
            _, stderr = sampler.communicate(timeout=generation.vllm_timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(sampler.pid)
            sampler.communicate()
            raise SpecError(
                [
                    f"generation.vllm_timeout_s: vLLM's sampling of {model.name_or_path} did not end within "
                    f"{generation.vllm_timeout_s:g} s: its engine hung, or this process's prompts need longer (raise it)"
                ],
                this_rank_only=True,
            ) from None
        if sampler.returncode != 0:
            said = [line for line in stderr.splitlines() if line.startswith("posttrain: ")]
            if said:
                raise SpecError([said[-1].removeprefix("posttrain: ")], this_rank_only=True)
            tail = stderr.strip().splitlines()[-20:]
            raise RuntimeError(f"vLLM's sampling process exited {sampler.returncode}:\n" + "\n".join(tail))
        return json.loads(out.read_text())


def kill_tree(pid: int) -> None:
    """Kills process ``pid`` and every process it started, and theirs (vLLM's engine core, its workers), which would
    outlive it: ``pid`` first, so that it starts no more."""
    try:
        root = psutil.Process(pid)
        descendants = root.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for process in (root, *descendants):
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


@torch.no_grad()
def sample(model: Any, tokenizer: Any, prompt: Any, generation: GenerationSpec, seed: int) -> List[str]:
    """``generation.num_samples`` completions of ``prompt``, each up to its end token, as text."""
    ids = prompt_ids(tokenizer, prompt)
    input_ids = torch.tensor([ids], device=model.device)
    greedy = generation.temperature == 0
    settings = {"do_sample": False} if greedy else {"do_sample": True, "temperature": generation.temperature}
    if not greedy:
        settings.update(top_p=generation.top_p, top_k=0)
    torch.manual_seed(seed)
    with sampling_from_the_logits(model):
        generated = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=generation.max_new_tokens,
            num_return_sequences=generation.num_samples,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
            use_cache=True,
            **settings,
        )
    ends = model.generation_config.eos_token_id
    ends = set(ends if isinstance(ends, list) else [ends]) | {tokenizer.eos_token_id}
    texts = []
    for completion in generated[:, len(ids) :].tolist():
        cut = next((i for i, token in enumerate(completion) if token in ends), len(completion))
        texts.append(tokenizer.decode(completion[:cut], skip_special_tokens=True))
    return texts
