"""Bad input through the real ``torchx`` CLI: exit 1, the message alone, nothing launched; secrets stay out of
--dryrun; and a rank waiting says where on SIGUSR1 (in a process of its own)."""

import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from golden_messages import BAD_INPUTS, resolve
from helpers import torchx

SFT = "templates/sft/tiny.yaml"


# one bad input of each kind through the real CLI: exit 1, the message alone, nothing launched
CLI_SAMPLE = [BAD_INPUTS[i] for i in (0, 15, 18, 20, 22, 29, 35, 47, 55, 66)]


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


def test_a_rank_prints_where_it_waits_on_sigusr1_and_goes_on() -> None:
    # how a hung job says where it hangs (tests/e2e/test_slurm.py signals the ranks of a job that outlives its test)
    code = """if True:
        import os, signal, time
        from posttrain.entrypoints.process import distributed
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


def test_secrets_never_appear_in_dryrun(tmp_path: Path) -> None:
    secret = "hf_posttrain_test_secret_value"
    result = torchx(["run", "-s", "local_cwd", "--dryrun", "posttrain.sft", "--spec", SFT], tmp_path, HF_TOKEN=secret)
    assert result.returncode == 0 and secret not in result.stdout + result.stderr
