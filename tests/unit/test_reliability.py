"""Reliability and security at submit and in process: bad input is rejected before anything is scheduled, through
the real CLI too (the message alone, nothing launched); the job's own checks in process; a rank waiting says where
on SIGUSR1; secrets stay out of args. (Real jobs that crash, hang, restart: ``tests/e2e/test_reliability.py``.)
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from golden_messages import (
    BATCH_OF_ZERO,
    BF16_AND_FP16,
    DATA_KEY_TYPO,
    DEEPSPEED_IS_OWNED,
    KEY_IN_THE_WRONG_SECTION,
    MINI_BATCHES_NOT_DIVIDING,
    MODEL_KEY_TYPO,
    MORE_MIN_THAN_MAX_NODES,
    NO_NODES,
    NOT_A_BOOLEAN,
    NOT_A_NUMBER,
    PPO_WITH_LORA,
    REFERENCE_WITH_LORA,
    REWARD_WEIGHTS_ARE_OWNED,
    TYPO_MESSAGE,
    TYPO_OVERRIDE,
    UNKNOWN_VLLM_MODE,
    ZERO_STEPS,
    ZERO_TIMEOUT,
)
from helpers import (
    REPO,
    load_template,
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
    ("sft", ["-j", "0x1"], NO_NODES),
    ("sft", ["-j", "1x0"], "-j '1x0': node and process counts must be at least 1"),
    ("sft", ["-j", "3:2x1"], MORE_MIN_THAN_MAX_NODES),
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
    ("sft", ["model.dtyp=auto"], MODEL_KEY_TYPO),
    ("sft", ["data.train.paht=x.jsonl"], DATA_KEY_TYPO),
    ("sft", ["model.learning_rate=1"], KEY_IN_THE_WRONG_SECTION),
    ("sft", ["trainig.max_steps=1"], "trainig: unknown key; did you mean training?"),
    ("sft", ["distributed.timeout=5"], "distributed.timeout: unknown key; did you mean distributed.timeout_s?"),
    ("sft", ["model.lora.rnk=8"], "model.lora.rnk: unknown key"),
    # keys the package owns
    (
        "sft",
        ["training.deepspeed=ds.json"],
        DEEPSPEED_IS_OWNED,
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
    ("sft", ["training.learning_rate=fast"], NOT_A_NUMBER),
    ("sft", ["training.max_steps=2.5"], "training.max_steps: expected an integer; got '2.5'"),
    ("sft", ["training.bf16=maybe"], "training.bf16: expected true/false or null; got 'maybe'"),
    ("sft", ["training.lr_scheduler_type=cosin"], "training.lr_scheduler_type: expected one of"),
    (
        "sft",
        ["training.per_device_train_batch_size=0"],
        BATCH_OF_ZERO,
    ),
    ("sft", ["training.learning_rate=-1"], "training.learning_rate: -1.0 is out of range; expected learning_rate > 0"),
    ("sft", ["training.max_steps=0"], ZERO_STEPS),
    (
        "sft",
        ["model.dtype=bf16"],
        "model.dtype: input should be 'auto', 'float32', 'bfloat16' or 'float16'; got 'bf16'",
    ),
    ("sft", ["model.trust_remote_code=maybe"], NOT_A_BOOLEAN),
    ("sft", ["distributed.timeout_s=0"], ZERO_TIMEOUT),
    ("sft", ["resume= "], "resume: expected auto, never or a checkpoint path"),
    # impossible combinations and hardware
    ("sft", ["training.bf16=true", "training.fp16=true"], BF16_AND_FP16),
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
        REWARD_WEIGHTS_ARE_OWNED,
    ),
    ("grpo", ["training.vllm_mode=remote"], UNKNOWN_VLLM_MODE),
    (
        "ppo",
        ["training.num_mini_batches=3"],
        MINI_BATCHES_NOT_DIVIDING,
    ),
    ("ppo", ["model.lora={r: 8}"], PPO_WITH_LORA),
    ("dpo", ["reference_model=org/ref", "model.lora={r: 8}"], REFERENCE_WITH_LORA),
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
    ("online_dpo", ["reference_model=org/ref", "model.lora={r: 8}"], REFERENCE_WITH_LORA),
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
    from posttrain.entrypoints.inputs.data import fit_batch, load_data
    from posttrain.entrypoints.inputs.models import load_tokenizer

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


def test_a_rank_prints_where_it_waits_on_sigusr1_and_goes_on() -> None:
    # how a hung job says where it hangs (tests/e2e/test_slurm.py signals the ranks of a job that outlives its test)
    code = """if True:
        import os, signal, time
        from posttrain.entrypoints.job import distributed
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


# ---------------------------------------------------------------- injection and secrets


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


# names that are secrets: their last part says so, or a password or credential is named anywhere
SECRET_NAMES = [
    "HF_TOKEN",
    "hf_token",
    "GITHUB_TOKEN",
    "WANDB_API_KEY",
    "WANDB_KEY",
    "PRIVATE_KEY",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_ACCESS_KEY_ID",  # half of the pair
    "CLIENT_SECRET",
    "DB_PASSWORD",
    "SMTP_PASSWD",
    "AZURE_CREDENTIALS",
]
# names that only contain a secret's word, or say where a secret lives
NOT_SECRET_NAMES = [
    "TOKENIZERS_PARALLELISM",
    "KEY_PREFIX",
    "MAX_TOKENS",
    "MONKEY",
    "SECRETS_BACKEND",
    "HF_TOKEN_PATH",
    "PASSWORD_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "SSH_KEY_DIR",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_env_refuses_a_name_that_is_a_secret(name: str) -> None:
    with pytest.raises(SpecError) as refused:
        algorithms.sft(spec=f"{REPO}/{SFT}", env={name: "abc"})
    assert str(refused.value).startswith(f"--env {name}: looks like a secret, and --env values show in --dryrun")


@pytest.mark.parametrize("name", NOT_SECRET_NAMES)
def test_env_passes_a_name_that_only_contains_a_secrets_word(name: str) -> None:
    assert algorithms.sft(spec=f"{REPO}/{SFT}", env={name: "false"}).roles[0].env[name] == "false"
