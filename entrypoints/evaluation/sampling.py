"""Sampling a prompt's completions the same way on any number of processes: from a seed of the prompt's own, with
the spec's settings only; in transformers one prompt at a time (no padding), or in vLLM, a process of its own per
model (entrypoints/vllm_sampler.py), where the job's environment has it: all the process's prompts at once, or an
evaluation's episodes a round of turns at a time (:func:`vllm_turns`)."""

import contextlib
import dataclasses
import importlib.util
import itertools
import json
import logging
import os
import random
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, NoReturn, Optional, Sequence, Tuple

import psutil
import torch

from posttrain.components.spec.judging import GenerationSpec
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.sections import ModelSpec
from posttrain.entrypoints.evaluation import episodes
from posttrain.entrypoints.generation.engine import Completion, Engine, Request, ended
from posttrain.entrypoints.generation.sampling import prompt_ids, sampling_from_the_logits
from posttrain.entrypoints.generation.vllm_engine import vllm_sampling
from posttrain.entrypoints.records.files import write_json_atomic

log = logging.getLogger("posttrain")

# a prompt's seed: the spec's, then its place in the data (each model draws with the same seeds: paired samples)
SEED_STRIDE = 1_000_003
# how long a sampling process that answered every round may take to end before it is stopped
ENDING_S = 60.0


# torchrun's variables, which the vLLM process must not see: it is a world of its own
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")
TORCHRUN_VARIABLES += ("ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")


def prompt_seed(generation: GenerationSpec, index: int) -> int:
    return generation.seed * SEED_STRIDE + index


def engine(generation: GenerationSpec) -> str:
    """What samples: the spec's engine, auto being vLLM where the job's environment has it."""
    installed = importlib.util.find_spec("vllm") is not None
    if generation.engine == "vllm" and not installed:
        raise SpecError(
            [
                "generation.engine: vllm is not installed in the job's environment (README: Generating with vLLM); "
                "use engine: transformers, or auto"
            ]
        )
    if generation.engine == "auto":
        return "vllm" if installed else "transformers"
    return generation.engine


def sample_with_vllm(
    model: ModelSpec, prompts: List[List[int]], seeds: List[int], generation: GenerationSpec
) -> List[List[str]]:
    """Each prompt's completions (its tokens, its seed) from vLLM, in a process of its own on this rank's GPU; past
    ``generation.vllm_timeout_s`` it is killed with its engine, and this rank stops in one line naming the model."""
    request = {"prompts": prompts, "seeds": seeds}
    with _sampler(model, generation, request) as (sampler, scratch, deadline):
        try:
            sampler.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            raise _timed_out(model, generation) from None
        _check_ran(sampler, scratch)
        return json.loads((scratch / "completions.json").read_text())


@contextlib.contextmanager
def vllm_turns(model: ModelSpec, generation: GenerationSpec, longest: int) -> Iterator[episodes.Turns]:
    """An engine for :func:`episodes.play_together`: vLLM, in a process of its own on this rank's GPU, that writes
    each round of turns it is given (episodes of at most ``longest`` tokens); past ``generation.vllm_timeout_s``
    from its start (its rounds and the tools' time between them) it is killed with its engine, and this rank stops
    in one line naming the model."""
    with _served(model, generation, longest) as (written, _):
        yield lambda round_: [ids for ids, _ in written(round_)]


@contextlib.contextmanager
def vllm_endpoint_engine(model: ModelSpec, generation: GenerationSpec, seed: int) -> Iterator[Tuple[Engine, int]]:
    """An engine for an agent program's endpoint (``endpoint.Endpoint``), and the longest sequence it takes: vLLM, as
    in :func:`vllm_turns`, each batch of requests a round, each request sampling as it asks, from a seed drawn from
    ``seed`` (the requests of episodes played together arrive in no fixed order: a draw is repeatable only where
    the calls are)."""
    draws = random.Random(seed)

    def sampled(request: Request) -> Dict[str, Any]:
        # how the request samples; the most it may write is the turn's budget
        return {key: value for key, value in vllm_sampling(request).items() if key != "max_tokens"}

    with _served(model, generation, None) as (written, longest):

        def generate(requests: Sequence[Request]) -> List[Completion]:
            round_ = [
                episodes.Turn(list(request.prompt_ids), request.max_tokens, draws.getrandbits(63), sampled(request))
                for request in requests
            ]
            return [ended(request, ids, logprobs) for request, (ids, logprobs) in zip(requests, written(round_))]

        yield generate, longest


@contextlib.contextmanager
def _served(
    model: ModelSpec, generation: GenerationSpec, longest: Optional[int]
) -> Iterator[Tuple[Callable[[List[episodes.Turn]], List[Tuple[List[int], List[float]]]], int]]:
    """vLLM's sampling process serving rounds of turns (sequences of at most ``longest`` tokens; None: the model's
    length): what writes a round (each turn's tokens and, where it samples as it says, their log-probs), and the
    engine's length. Bounded as :func:`vllm_turns` says."""
    asks, asked = os.pipe()
    answered, answers = os.pipe()
    held = {asks, asked, answered, answers}

    def close(descriptor: int) -> None:
        if descriptor in held:
            held.discard(descriptor)
            os.close(descriptor)

    try:
        with _sampler(model, generation, {"longest": longest}, serve=(asks, answers)) as (sampler, scratch, deadline):
            # the sampler's ends are its own: a write to a sampler that died breaks the pipe
            close(asks)
            close(answers)
            pending = b""

            def said() -> str:
                # what the sampler says next (``ready``, then each round's number once that round's tokens are
                # written); looked at every few seconds besides (its engine, forked, may hold the pipe open after
                # it died)
                nonlocal pending
                while b"\n" not in pending:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise _timed_out(model, generation)
                    if not select.select([answered], [], [], min(left, 5.0))[0]:
                        if sampler.poll() is not None:
                            _ended(sampler, scratch)
                        continue
                    chunk = os.read(answered, 4096)
                    if not chunk:
                        _ended(sampler, scratch)
                    pending += chunk
                line, _, pending = pending.partition(b"\n")
                return line.decode()

            if said() != "ready":
                raise RuntimeError("vLLM's sampling process did not say it was ready first")
            length = json.loads((scratch / "engine.json").read_text())["max_model_len"]
            rounds = itertools.count()

            def write(round_: List[episodes.Turn]) -> List[Tuple[List[int], List[float]]]:
                number = next(rounds)
                asked_path = scratch / f"round-{number}.json"
                write_json_atomic(asked_path, [dataclasses.asdict(turn) for turn in round_])
                try:
                    os.write(asked, f"{number}\n".encode())
                except BrokenPipeError:
                    _ended(sampler, scratch)
                answer = said()
                if answer != str(number):
                    raise RuntimeError(f"vLLM's sampling process answered round {answer} for round {number}")
                written_path = scratch / f"round-{number}-written.json"
                written = json.loads(written_path.read_text())
                asked_path.unlink()
                written_path.unlink()
                return [(turn["ids"], turn["logprobs"]) for turn in written]

            yield write, length
            # every round answered: the sampler is told to end (not left to see its pipe closed: a process forked
            # meanwhile, a tool's, holds a copy), and given a while to; its tokens are in hand whatever it does then
            with contextlib.suppress(BrokenPipeError):
                os.write(asked, b"end\n")
            with contextlib.suppress(subprocess.TimeoutExpired):
                sampler.wait(timeout=ENDING_S)
            if sampler.returncode != 0:
                log.warning(
                    "vLLM's sampling process of %s did not end cleanly once done; it is stopped", model.name_or_path
                )
    finally:
        for descriptor in list(held):
            close(descriptor)


def _ended(sampler: subprocess.Popen, scratch: Path) -> NoReturn:
    """The sampling process ended before it was done (before it said it was ready, or answered a round): its own
    line, or the end of its stderr."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        sampler.wait(timeout=ENDING_S)
    _check_ran(sampler, scratch)
    raise RuntimeError("vLLM's sampling process ended before it was done")


@contextlib.contextmanager
def _sampler(
    model: ModelSpec, generation: GenerationSpec, request: Dict[str, Any], serve: Optional[Tuple[int, int]] = None
) -> Iterator[Tuple[subprocess.Popen, Path, float]]:
    """The sampling process (entrypoints/vllm_sampler.py), started on ``request``, its scratch directory, and when
    it must have ended (``generation.vllm_timeout_s`` from now); killed with its engine where it still runs as
    the context ends."""
    env = {key: value for key, value in os.environ.items() if key not in TORCHRUN_VARIABLES}
    env = {key: value for key, value in env.items() if not key.startswith("TORCHELASTIC_")}
    if torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        device = torch.cuda.current_device()
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[device] if visible else str(device)
    with tempfile.TemporaryDirectory(prefix="posttrain-vllm-sampling-") as directory:
        scratch = Path(directory)
        settings = {"model": model.model_dump(mode="json"), "generation": generation.model_dump(mode="json")}
        (scratch / "request.json").write_text(json.dumps({**settings, **request}))
        command = [
            sys.executable,
            "-m",
            "posttrain.entrypoints.vllm_sampler",
            "--request",
            str(scratch / "request.json"),
        ]
        command += ["--serve", *map(str, serve)] if serve else ["--out", str(scratch / "completions.json")]
        # in this process's group, not a session of its own: torchrun, stopping the job, signals the group, and a
        # sampler out of it (its engine's processes with it) would outlive the job, holding the GPU; its stderr in a
        # file, where its last line is read back (a pipe, left unread while it serves, would fill and stop it)
        with open(scratch / "stderr.log", "w") as stderr:
            sampler = subprocess.Popen(command, env=env, stderr=stderr, pass_fds=serve or ())
        try:
            yield sampler, scratch, time.monotonic() + generation.vllm_timeout_s
        finally:
            if sampler.poll() is None:
                kill_tree(sampler.pid)
                sampler.wait()


def _timed_out(model: ModelSpec, generation: GenerationSpec) -> SpecError:
    return SpecError(
        [
            f"generation.vllm_timeout_s: vLLM's sampling of {model.name_or_path} did not end within "
            f"{generation.vllm_timeout_s:g} s: its engine hung, or this process's prompts need longer (raise it)"
        ],
        this_rank_only=True,
    )


def _check_ran(sampler: subprocess.Popen, scratch: Path) -> None:
    """Where the sampling process failed: its own ``posttrain:`` line, as this rank's, or the end of its stderr."""
    if sampler.returncode == 0:
        return
    stderr = (scratch / "stderr.log").read_text(errors="replace")
    said = [line for line in stderr.splitlines() if line.startswith("posttrain: ")]
    if said:
        raise SpecError([said[-1].removeprefix("posttrain: ")], this_rank_only=True)
    tail = stderr.strip().splitlines()[-20:]
    raise RuntimeError(f"vLLM's sampling process exited {sampler.returncode}:\n" + "\n".join(tail))


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
