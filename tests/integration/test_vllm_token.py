"""A trainer takes the job's token out of its environment: a process it starts (a reward function's, say) has none,
and code that asks still gets it."""

import os
import subprocess
import sys

import pytest

from helpers import JOB_TOKEN as TOKEN
from posttrain.components.spec.generation import VLLM_TOKEN_VARIABLE
from posttrain.entrypoints.generation import vllm_token


def test_a_trainer_takes_the_token_out_of_its_environment_and_gives_it_only_to_code_that_asks(
    job_token: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm_token, "_TAKEN", {})
    # what runtime.run does first, before any user code is imported
    vllm_token.take_from_environment()
    assert VLLM_TOKEN_VARIABLE not in os.environ
    # what a reward function starts: no token in its environment
    reward_process = subprocess.run(
        [sys.executable, "-c", f"import os; print(os.environ.get({VLLM_TOKEN_VARIABLE!r}))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert reward_process.stdout == "None\n"
    # the trainers' own use, or code that asks
    assert vllm_token.job_token() == TOKEN
