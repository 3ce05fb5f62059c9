"""Reliability and security at submit and in process: bad input is rejected before anything is scheduled, with its
message alone; the job's own checks in process; secrets stay out of args. (Through the real CLI, and a rank that says
where it waits: ``tests/integration/test_reliability.py``; real jobs that crash, hang, restart:
``tests/e2e/test_reliability.py``.)
"""

import json
from pathlib import Path
from typing import List

import pytest

from golden_messages import (
    BAD_INPUTS,
    TYPO_MESSAGE,
    TYPO_OVERRIDE,
    resolve,
)
from helpers import (
    REPO,
    load_template,
)
from posttrain.components import algorithms
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.registry import SPEC_CLASSES

SFT = "templates/sft/tiny.yaml"


@pytest.mark.parametrize("component, args, message", BAD_INPUTS, ids=[" ".join(a) or c for c, a, _ in BAD_INPUTS])
def test_bad_input_is_rejected_with_its_message_alone(
    monkeypatch: pytest.MonkeyPatch, broken_specs: dict, component: str, args: List[str], message: str
) -> None:
    """In-process, as ``torchx run`` does it: torchx's own argument parsing, then the component."""
    from torchx.specs.builders import materialize_appdef
    from torchx.specs.finder import get_component

    monkeypatch.chdir(REPO)
    # what torchx's CLI sets
    monkeypatch.setenv("TORCHX_CONTEXT_NAME", "cli_run")
    with pytest.raises(SystemExit) as exit_info:
        materialize_appdef(get_component(f"posttrain.{component}").fn, resolve(args, broken_specs, component))
    assert message in str(exit_info.value.code)


@pytest.mark.parametrize("algorithm", sorted(SPEC_CLASSES))
def test_every_component_names_an_unknown_training_key(monkeypatch: pytest.MonkeyPatch, algorithm: str) -> None:
    monkeypatch.setenv("TORCHX_CONTEXT_NAME", "cli_run")
    with pytest.raises(SystemExit) as stopped:
        getattr(algorithms, algorithm)(TYPO_OVERRIDE, spec=f"{REPO}/templates/{algorithm}/tiny.yaml")
    assert str(stopped.value) == TYPO_MESSAGE


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
            load_tokenizer(spec.model.name_or_path, spec.model, "right")
        data = load_data(spec.data.train, spec.data.columns, "data.train", spec.data_formats)
        fit_batch(spec.training, spec.config_class, len(data), world_size=2)
    assert str(error.value).startswith(message)


# ---------------------------------------------------------------- restarts, kills, preemption


# ---------------------------------------------------------------- injection and secrets


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
    # half of the pair
    "AWS_ACCESS_KEY_ID",
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
