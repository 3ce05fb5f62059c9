"""The real ``torchx`` CLI: discovery, --dryrun, help, and bad input that launches nothing."""

import re
from pathlib import Path

import pytest

from golden_messages import BATCH_OF_ZERO, DEEPSPEED_IS_OWNED, NO_NODES, TYPO_MESSAGE, TYPO_OVERRIDE
from helpers import torchx
from posttrain.components.spec.registry import SPEC_CLASSES

TINY = "templates/sft/tiny.yaml"


def test_builtins_list_posttrain_and_keep_torchx_own(tmp_path: Path) -> None:
    result = torchx(["builtins"], tmp_path)
    assert result.returncode == 0, result.stderr
    for algorithm in SPEC_CLASSES:
        assert f"posttrain.{algorithm}" in result.stdout
    assert "dist.ddp" in result.stdout and "utils.echo" in result.stdout


def test_dryrun_shows_the_validated_spec_inside_a_torchrun_command(tmp_path: Path) -> None:
    result = torchx(["run", "-s", "local_cwd", "--dryrun", "posttrain.sft", "--spec", TINY, "-j", "2x1"], tmp_path)
    assert result.returncode == 0, result.stderr
    # the pieces pprint wraps a long string into, joined
    out = re.sub(r"['\"]\n\s*['\"]", "", result.stdout)
    assert "exec python -m posttrain.entrypoints.launcher --rdzv_backend c10d" in out
    assert "--tee 3" in out and "--rdzv_backend c10d" in out
    assert "--rdzv_endpoint" in out and "${TORCHX_RANK0_HOST:=localhost}:29500" in out
    assert "--spec-json" in out and '"name_or_path":"builtin:tiny-llama"' in out


def test_component_help_is_the_docstring(tmp_path: Path) -> None:
    result = torchx(["run", "-s", "local_cwd", "posttrain.sft", "--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Supervised fine-tuning" in result.stdout
    assert "max_restarts" in result.stdout and "--spec" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        ([TYPO_OVERRIDE], TYPO_MESSAGE),
        (["-j", "0x1"], NO_NODES),
        (
            ["training.per_device_train_batch_size=0"],
            BATCH_OF_ZERO,
        ),
        (
            ["training.deepspeed=ds.json"],
            DEEPSPEED_IS_OWNED,
        ),
    ],
)
def test_bad_input_prints_the_message_alone_and_launches_nothing(tmp_path: Path, args: list, message: str) -> None:
    result = torchx(["run", "-s", "local_cwd", "posttrain.sft", "--spec", TINY, *args], tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == message
    assert "Traceback" not in result.stdout + result.stderr
    assert "local_cwd://" not in result.stdout, "an app was launched"


def test_a_spec_for_another_algorithm_is_refused(tmp_path: Path) -> None:
    result = torchx(["run", "-s", "local_cwd", "posttrain.dpo", "--spec", TINY], tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().startswith("algorithm: this spec is for 'sft' but was given to posttrain.dpo")


def test_a_missing_spec_file_is_named(tmp_path: Path) -> None:
    result = torchx(["run", "-s", "local_cwd", "posttrain.sft", "--spec", "templates/sft/nope.yaml"], tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == "--spec: no such file: templates/sft/nope.yaml"
