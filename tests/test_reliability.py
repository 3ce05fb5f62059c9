"""Reliability and security through the real CLI and real jobs.

Bad input is rejected before anything is scheduled (or, where only the job
can tell, before the model loads); a crashing or hanging rank ends the job
in bounded time with its traceback visible; restarts and preemption resume;
spec values cannot inject commands; secrets stay out of args, specs and logs.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from helpers import (
    REPO,
    TYPO_MESSAGE,
    TYPO_OVERRIDE,
    assert_stopped_once,
    assert_succeeded,
    free_port,
    load_template,
    read_json,
    run_template,
    start_training,
    torchx,
)
from posttrain.components import algorithms
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.registry import SPEC_CLASSES

SFT = "templates/sft/tiny.yaml"

# (component, extra CLI arguments, what the one-line message must say)
BAD_INPUTS = [
    # component arguments
    ("sft", ["-j", "2x"], "-j '2x': expected [MIN:]NNODESxNPROC"),
    ("sft", ["-j", "0x1"], "-j '0x1': node and process counts must be at least 1"),
    ("sft", ["-j", "1x0"], "-j '1x0': node and process counts must be at least 1"),
    ("sft", ["-j", "3:2x1"], "-j '3:2x1': the minimum node count 3 exceeds the maximum 2"),
    ("sft", ["-j", "two"], "-j 'two': expected"),
    ("sft", ["--tee", "5"], "--tee 5: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both)"),
    ("sft", ["--rdzv_port", "0"], "--rdzv_port 0: expected a TCP port in 1..65535"),
    ("sft", ["--rdzv_port", "70000"], "--rdzv_port 70000: expected a TCP port in 1..65535"),
    ("sft", ["--rdzv_backend", "zk"], "--rdzv_backend 'zk': expected one of c10d, static, etcd, etcd-v2"),
    ("sft", ["--max_retries", "-1"], "--max_retries -1: must be 0 or more"),
    ("sft", ["--max_restarts", "-2"], "--max_restarts -2: must be 0 or more"),
    ("sft", ["--memMB", "0"], "--memMB 0: must be positive"),
    ("sft", ["--cpu", "0"], "--cpu 0: must be at least 1"),
    ("sft", ["-h", "gpu.nope"], "-h 'gpu.nope': unknown named resource"),
    ("sft", ["--mounts", "type=magic"], "--mounts type=magic"),
    ("sft", ["--env", "HF_TOKEN=hf_abc"], "--env HF_TOKEN: looks like a secret"),
    ("sft", ["--env", "WANDB_API_KEY=abc"], "--env WANDB_API_KEY: looks like a secret"),
    # the spec file
    ("sft", ["--spec", "templates/sft/missing.yaml"], "--spec: no such file: templates/sft/missing.yaml"),
    ("sft", ["--spec", "{broken_yaml}"], "is not valid YAML"),
    ("sft", ["--spec", "{list_yaml}"], "must hold a mapping of sections"),
    ("dpo", ["--spec", SFT], "algorithm: this spec is for 'sft' but was given to posttrain.dpo"),
    ("sft", ["algorithm=sfft"], "algorithm: unknown 'sfft'; expected one of"),
    # unknown and misplaced keys, at every level
    ("sft", [TYPO_OVERRIDE], TYPO_MESSAGE),
    ("sft", ["model.dtyp=auto"], "model.dtyp: unknown key; did you mean model.dtype?"),
    ("sft", ["data.train.paht=x.jsonl"], "data.train.paht: unknown key; did you mean data.train.path?"),
    ("sft", ["model.learning_rate=1"], "model.learning_rate: unknown key here; it belongs at training.learning_rate"),
    ("sft", ["trainig.max_steps=1"], "trainig: unknown key; did you mean training?"),
    ("sft", ["distributed.timeout=5"], "distributed.timeout: unknown key; did you mean distributed.timeout_s?"),
    ("sft", ["model.lora.rnk=8"], "model.lora.rnk: unknown key"),
    # keys the package owns
    (
        "sft",
        ["training.deepspeed=ds.json"],
        "training.deepspeed: set by posttrain, not in training; use distributed.deepspeed",
    ),
    (
        "sft",
        ["training.use_cpu=true"],
        "training.use_cpu: set by posttrain, not in training; posttrain sets it from the hardware",
    ),
    (
        "sft",
        ["training.ddp_timeout=10"],
        "training.ddp_timeout: set by posttrain, not in training; use distributed.timeout_s",
    ),
    (
        "sft",
        ["training.resume_from_checkpoint=x"],
        "training.resume_from_checkpoint: set by posttrain, not in training; use resume",
    ),
    ("sft", ["training.hub_token=hf_x"], "training.hub_token: set by posttrain, not in training; it is a secret"),
    # wrong types and out-of-range values
    ("sft", ["training.learning_rate=fast"], "training.learning_rate: expected a number; got 'fast'"),
    ("sft", ["training.max_steps=2.5"], "training.max_steps: expected an integer; got '2.5'"),
    ("sft", ["training.bf16=maybe"], "training.bf16: expected true/false or null; got 'maybe'"),
    ("sft", ["training.lr_scheduler_type=cosin"], "training.lr_scheduler_type: expected one of"),
    (
        "sft",
        ["training.per_device_train_batch_size=0"],
        "training.per_device_train_batch_size: 0 is out of range; expected per_device_train_batch_size >= 1 (examples per process and step)",
    ),
    ("sft", ["training.learning_rate=-1"], "training.learning_rate: -1.0 is out of range; expected learning_rate > 0"),
    ("sft", ["training.max_steps=0"], "training.max_steps: must be positive, or -1 to train by epochs; got 0"),
    (
        "sft",
        ["model.dtype=bf16"],
        "model.dtype: input should be 'auto', 'float32', 'bfloat16' or 'float16'; got 'bf16'",
    ),
    ("sft", ["model.trust_remote_code=maybe"], "model.trust_remote_code: input should be a valid boolean"),
    ("sft", ["distributed.timeout_s=0"], "distributed.timeout_s: must be positive; got 0"),
    ("sft", ["resume= "], "resume: expected auto, never or a checkpoint path"),
    # impossible combinations and hardware
    ("sft", ["training.bf16=true", "training.fp16=true"], "training.bf16, training.fp16: at most one can be true"),
    ("sft", ["model.dtype=float16", "training.bf16=true"], "model.dtype: float16 contradicts training.bf16: true"),
    ("sft", ["data.train.name=org/set"], "data.train: give exactly one of path"),
    ("sft", ["-h", "cpu.small", "training.fp16=true"], "training.fp16: -h cpu.small has no GPU"),
    ("sft", ["--launcher", "mpirun"], "--launcher 'mpirun': expected one of torchrun, deepspeed"),
    ("sft", ["--launcher", "deepspeed", "-j", "1:2x1"], "-j 1:2x1: DeepSpeed's launcher runs a fixed number of nodes"),
    ("sft", ["--launcher", "deepspeed", "--max_restarts", "2"], "--max_restarts 2: worker restarts are torchrun's"),
    (
        "sft",
        ["-h", "cpu.small", "distributed.fsdp={}"],
        "distributed.fsdp: -h cpu.small has no GPU, and accelerate runs FSDP on GPUs only",
    ),
    (
        "sft",
        ["distributed.fsdp={}", "distributed.deepspeed={zero_stage: 2}"],
        "distributed: deepspeed and fsdp both shard the model",
    ),
    # batch arithmetic and algorithm-specific settings
    (
        "grpo",
        ["training.num_generations=3"],
        "training.num_generations: the generation batch (16 = 8 per device x 2 processes x 1 steps) must divide by num_generations (3)",
    ),
    ("grpo", ["rewards.0.builtin=nope"], "rewards.0.builtin: unknown built-in reward 'nope'"),
    (
        "grpo",
        ["training.reward_weights=[1.0]"],
        "training.reward_weights: set by posttrain, not in training; use rewards[].weight",
    ),
    ("grpo", ["training.vllm_mode=remote"], "training.vllm_mode: expected one of 'colocate', 'server'; got 'remote'"),
    (
        "ppo",
        ["training.num_mini_batches=3"],
        "training.num_mini_batches: 3 must divide per_device_train_batch_size (16)",
    ),
    ("ppo", ["model.lora={r: 8}"], "model.lora: posttrain's PPO trains full weights"),
    ("dpo", ["reference_model=org/ref", "model.lora={r: 8}"], "reference_model: not used with model.lora"),
    # malformed overrides
    ("sft", ["training.max_steps"], "override 'training.max_steps': expected key.path=value"),
    ("sft", ["training.max_steps.x=3"], "training.max_steps is a value, not a section"),
    # posttrain loads every model itself; the new algorithms' own keys
    (
        "grpo",
        ["training.trust_remote_code=true"],
        "training.trust_remote_code: set by posttrain, not in training; use model.trust_remote_code",
    ),
    (
        "dpo",
        ["training.model_init_kwargs={dtype: bfloat16}"],
        "training.model_init_kwargs: set by posttrain, not in training; posttrain loads the models",
    ),
    (
        "distill",
        ["training.teacher_model_name_or_path=x"],
        "training.teacher_model_name_or_path: set by posttrain, not in training; use teacher_model",
    ),
    ("distill", ["teacher_model= "], "teacher_model: expected a path or hub id; got an empty string"),
    (
        "online_dpo",
        ["training.reward_model_path=x"],
        "training.reward_model_path: set by posttrain, not in training; use rewards",
    ),
    ("online_dpo", ["rewards=[]"], "rewards: give at least one reward"),
    ("online_dpo", ["reference_model=org/ref", "model.lora={r: 8}"], "reference_model: not used with model.lora"),
]


@pytest.fixture(scope="module")
def broken_specs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    directory = tmp_path_factory.mktemp("specs")
    (directory / "broken.yaml").write_text("algorithm: sft\nmodel: [unclosed\n")
    (directory / "list.yaml").write_text("- algorithm\n- sft\n")
    return {"broken_yaml": str(directory / "broken.yaml"), "list_yaml": str(directory / "list.yaml")}


def resolve(args: List[str], broken_specs: dict, component: str) -> List[str]:
    args = [broken_specs.get(a.strip("{}"), a) for a in args]
    return args if "--spec" in args else ["--spec", f"templates/{component}/tiny.yaml", *args]


@pytest.mark.parametrize("component, args, message", BAD_INPUTS, ids=[" ".join(a) or c for c, a, _ in BAD_INPUTS])
def test_bad_input_is_rejected_with_its_message_alone(
    monkeypatch: pytest.MonkeyPatch, broken_specs: dict, component: str, args: List[str], message: str
) -> None:
    """In-process, as ``torchx run`` does it: torchx's own argument parsing, then the component."""
    from torchx.specs.builders import materialize_appdef
    from torchx.specs.finder import get_component

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("TORCHX_CONTEXT_NAME", "cli_run")  # what torchx's CLI sets
    with pytest.raises(SystemExit) as exit_info:
        materialize_appdef(get_component(f"posttrain.{component}").fn, resolve(args, broken_specs, component))
    assert message in str(exit_info.value.code)


@pytest.mark.parametrize("algorithm", sorted(SPEC_CLASSES))
def test_every_component_names_an_unknown_training_key(monkeypatch: pytest.MonkeyPatch, algorithm: str) -> None:
    monkeypatch.setenv("TORCHX_CONTEXT_NAME", "cli_run")
    with pytest.raises(SystemExit) as stopped:
        getattr(algorithms, algorithm)(TYPO_OVERRIDE, spec=f"{REPO}/templates/{algorithm}/tiny.yaml")
    assert str(stopped.value) == TYPO_MESSAGE


# one bad input of each kind through the real CLI: exit 1, the message alone, nothing launched
CLI_SAMPLE = [BAD_INPUTS[i] for i in (0, 15, 18, 20, 22, 29, 35, 47, 55, 62)]


@pytest.mark.parametrize("component, args, message", CLI_SAMPLE, ids=[" ".join(a) for c, a, _ in CLI_SAMPLE])
def test_bad_input_through_the_cli_prints_the_message_alone_and_launches_nothing(
    tmp_path: Path, broken_specs: dict, component: str, args: List[str], message: str
) -> None:
    result = torchx(
        ["run", "-s", "local_cwd", f"posttrain.{component}", *resolve(args, broken_specs, component)], tmp_path
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stdout + result.stderr and "usage:" not in result.stderr
    assert "local_cwd://" not in result.stdout, "an app was launched"


# ---------------------------------------------------------------- checks only the job can make


def job_logs(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


@pytest.mark.e2e
@pytest.mark.parametrize(
    "overrides, message",
    [
        # one launch per mechanism: the data checks and the model loader (the rest of their messages in process below)
        (["data.train.path=templates/data/nope.jsonl"], "data.train.path: no such file: templates/data/nope.jsonl"),
        (["model.name_or_path=./models/none"], "model.name_or_path: no such directory: ./models/none"),
    ],
)
def test_job_side_input_errors_end_every_rank_before_training(tmp_path: Path, overrides: list, message: str) -> None:
    result = run_template("sft/tiny.yaml", tmp_path, tmp_path / "out", overrides=overrides)
    logs = assert_stopped_once(result, message)  # rank 0 alone says it; both ranks stop
    assert "training sft on" not in logs


@pytest.mark.parametrize(
    "template, change, message",
    [
        (
            "sft/tiny.yaml",
            {"path": "templates/data/prompts.jsonl"},
            "data.train: found columns ['prompt']; expected (messages)",
        ),
        (
            "dpo/tiny.yaml",
            {"path": "templates/data/sft_chat.jsonl"},
            "data.train: found columns ['messages']; expected (prompt, chosen, rejected) or (chosen, rejected)",
        ),
        ("sft/tiny.yaml", {"path": "{one_row}"}, "data.train: 1 rows cannot give each of the 2 processes one example"),
        ("sft/tiny.yaml", {"model": "nobody/no-such-model"}, "model: cannot load 'nobody/no-such-model'"),
    ],
)
def test_job_side_checks_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, template: str, change: dict, message: str
) -> None:
    """What the job checks before any model loads, each mechanism launched once above; the messages here."""
    from posttrain.components.spec.loading import validate
    from posttrain.entrypoints.data import fit_batch, load_data
    from posttrain.entrypoints.models import load_tokenizer

    monkeypatch.chdir(REPO)
    one_row = tmp_path / "one.jsonl"
    one_row.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    raw = load_template(template)
    if "path" in change:
        raw["data"]["train"]["path"] = change["path"].format(one_row=one_row)
    if "model" in change:
        raw["model"]["name_or_path"] = change["model"]
    spec = validate(raw)
    with pytest.raises(SpecError) as error:
        if "model" in change:
            load_tokenizer(spec.model.name_or_path, spec, "right")
        data = load_data(spec.data.train, spec.data.columns, "data.train", spec.data_formats)
        fit_batch(spec.training, spec.config_class, len(data), world_size=2)
    assert str(error.value).startswith(message)


# ---------------------------------------------------------------- crashes and hangs


def fault_time(logs: str) -> float:
    line = next(line for line in logs.splitlines() if "posttrain fault injection" in line)
    return float(line.rsplit("t=", 1)[1])


@pytest.mark.e2e
@pytest.mark.parametrize("fault", ["raise:1:5", "exit:1:5", "raise:0:0"])
def test_a_crashing_rank_ends_the_job_within_30_s_in_one_line_its_traceback_kept(tmp_path: Path, fault: str) -> None:
    result = run_template("sft/tiny.yaml", tmp_path, tmp_path / "out", POSTTRAIN_FAULT=fault)
    ended = time.time()
    logs = job_logs(result)
    assert result.returncode != 0
    assert ended - fault_time(logs) <= 30
    kind, rank, _ = fault.split(":")
    if kind == "raise":
        kept = tmp_path / "out" / "logs" / f"traceback-rank{rank}.txt"
        line = (
            rf"posttrain: rank {rank} crashed: RuntimeError: posttrain fault injection: raise on rank {rank} at step "
        )
        assert re.search(
            line + rf"\d+, t=[\d.]+ \(at callbacks.py:\d+ in _maybe_fire\); traceback in {re.escape(str(kept))}\n", logs
        ), logs[-3000:]
        assert "Traceback (most recent call last)" in kept.read_text() and "Traceback" not in logs
    else:
        assert re.search(rf"posttrain: rank {rank} \(pid \d+\) exited with code 13 without saying why", logs), logs[
            -3000:
        ]
    job = logs.partition("AppStatus:")[0]  # torchx's closing status repeats the line as the app's structured error
    assert job.count("posttrain: rank") == 1 and "ChildFailedError" not in logs


@pytest.mark.e2e
def test_a_hanging_rank_ends_the_job_within_the_timeout(tmp_path: Path) -> None:
    timeout_s = 20
    result = run_template(
        "sft/tiny.yaml",
        tmp_path,
        tmp_path / "out",
        overrides=[f"distributed.timeout_s={timeout_s}"],
        POSTTRAIN_FAULT="hang:1:5",
        timeout=300,
    )
    ended = time.time()
    logs = job_logs(result)
    assert result.returncode != 0
    # the other rank's collective times out after timeout_s; torchrun then stops the hung rank
    # (SIGTERM, then SIGKILL after its 30 s grace)
    assert ended - fault_time(logs) <= timeout_s + 45
    assert f"Timed out waiting {timeout_s * 1000}ms" in logs


def test_a_rank_prints_where_it_waits_on_sigusr1_and_goes_on() -> None:
    # how a hung job says where it hangs (tests/test_slurm.py signals the ranks of a job that outlives its test)
    code = """if True:
        import os, signal, time
        from posttrain.entrypoints import distributed
        distributed.setup_logging()
        def waits_here():
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.5)
        waits_here()
        print("went on")
    """
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout == "went on\n", result.stderr
    assert "Current thread" in result.stderr and "in waits_here" in result.stderr


# ---------------------------------------------------------------- restarts, kills, preemption


@pytest.mark.e2e
def test_a_restart_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    result = run_template(
        "sft/tiny.yaml", tmp_path, output_dir, extra_args=["--max_restarts", "1"], POSTTRAIN_FAULT="exit:1:25"
    )
    assert_succeeded(result)
    summary = read_json(output_dir / "run_summary.json")
    assert summary["resumed_from"] == str(output_dir / "checkpoint-20")
    assert summary["global_steps"] == 40
    # the history is the checkpoint's steps, then the restarted attempt's: each step once, none lost
    steps = [entry["step"] for entry in read_json(output_dir / "trainer_state.json")["log_history"] if "loss" in entry]
    assert steps == list(range(1, 41))


@pytest.mark.e2e
def test_a_kill_during_a_save_leaves_the_previous_checkpoint_and_resume_ignores_the_partial_one(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    result = run_template(
        "sft/tiny.yaml", tmp_path, output_dir, extra_args=["--max_restarts", "1"], POSTTRAIN_FAULT="kill:0:40"
    )
    assert_succeeded(result)
    assert "posttrain fault injection: kill on rank 0 at step 40" in job_logs(result)
    summary = read_json(output_dir / "run_summary.json")
    assert summary["resumed_from"] == str(output_dir / "checkpoint-20"), "the partial checkpoint-40 must be skipped"
    assert summary["global_steps"] == 40


@pytest.mark.e2e
def test_sigterm_saves_a_checkpoint_and_the_next_run_resumes_from_it(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    log_path = tmp_path / "job.log"
    args = [
        "run",
        "-s",
        "local_cwd",
        "posttrain.sft",
        "--spec",
        SFT,
        "--rdzv_port",
        str(free_port()),
        f"training.output_dir={output_dir}",
        "training.max_steps=3000",
        "training.save_steps=100000",
    ]
    job = start_training(args, tmp_path, log_path, steps=5)
    try:
        agent = subprocess.run(
            ["pgrep", "-f", f"posttrain.entrypoints.launcher .*{output_dir}"], capture_output=True, text=True
        ).stdout.split()
        assert agent, "the torchrun agent was not found"
        os.kill(int(agent[0]), signal.SIGTERM)  # what a scheduler's preemption does
        job.wait(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    logs = log_path.read_text()
    assert job.returncode != 0
    assert "SIGTERM: saved checkpoint-" in logs
    checkpoints = list(output_dir.glob("checkpoint-*"))
    assert len(checkpoints) == 1
    saved_step = read_json(checkpoints[0] / "trainer_state.json")["global_step"]
    assert 5 <= saved_step < 3000

    # a changed max_steps is a different spec, so the checkpoint is named explicitly
    resumed = run_template(
        "sft/tiny.yaml",
        tmp_path,
        output_dir,
        overrides=[f"training.max_steps={saved_step + 3}", f"resume={checkpoints[0]}"],
    )
    assert_succeeded(resumed)
    summary = read_json(output_dir / "run_summary.json")
    assert summary["resumed_from"] == str(checkpoints[0]) and summary["global_steps"] == saved_step + 3


# ---------------------------------------------------------------- injection and secrets

NASTY = 'it\'s "quoted"; $(touch {sentinel}) `touch {sentinel}` && echo $HOME \\ ünïcödé ${{app_id}}\nsecond line'


@pytest.mark.e2e
def test_spec_values_reach_the_job_byte_exactly_and_run_nothing(tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    nasty = NASTY.format(sentinel=sentinel)
    output_dir = tmp_path / "out"
    secret = "hf_posttrain_test_secret_value"
    result = run_template(
        "sft/tiny.yaml",
        tmp_path,
        output_dir,
        overrides=["training.max_steps=2", f"training.run_name={nasty}"],
        HF_TOKEN=secret,
        WANDB_API_KEY=secret,
    )
    assert_succeeded(result)
    assert not sentinel.exists(), "a spec value was executed"
    assert read_json(output_dir / "run_summary.json")["spec"]["training"]["run_name"] == nasty
    assert read_json(output_dir / "posttrain_spec.json")["training"]["run_name"] == nasty
    # secrets travel in the environment only: never in args, the spec, the outputs or the logs
    assert secret not in job_logs(result)
    for path in output_dir.rglob("*.json"):
        assert secret not in path.read_text(), path


def test_secrets_never_appear_in_dryrun(tmp_path: Path) -> None:
    secret = "hf_posttrain_test_secret_value"
    result = torchx(["run", "-s", "local_cwd", "--dryrun", "posttrain.sft", "--spec", SFT], tmp_path, HF_TOKEN=secret)
    assert result.returncode == 0 and secret not in result.stdout + result.stderr


def test_remote_code_is_off_unless_the_spec_says_so() -> None:
    from posttrain.components.spec.loading import load_spec

    assert load_spec(str(REPO / SFT)).model.trust_remote_code is False


def test_env_may_name_where_a_secret_lives_but_not_the_secret() -> None:
    """HF_TOKEN_PATH points at a mounted file (docs: Schedulers, Kubernetes); HF_TOKEN itself is refused."""
    app = algorithms.sft(spec=f"{REPO}/{SFT}", env={"HF_TOKEN_PATH": "/secrets/hf/token"})
    assert app.roles[0].env["HF_TOKEN_PATH"] == "/secrets/hf/token"
    with pytest.raises(SpecError, match="--env HF_TOKEN: looks like a secret"):
        algorithms.sft(spec=f"{REPO}/{SFT}", env={"HF_TOKEN": "hf_abc"})
