"""The job fails fast and clearly, through the real ``torchx run``: bad data (the client's line, then the job's), a
reward returning NaN on one rank, a reward that never returns or ends its process, a missing earlier run's output;
each one ``posttrain:`` line (in process, one test
per message: ``tests/unit/job/test_job_errors.py``).
"""

import json
import textwrap
from pathlib import Path

import pytest

from helpers import (
    REPO,
    assert_stopped_once,
    run_template,
)

# ---------------------------------------------------------------- data


# ---------------------------------------------------------------- the TRL config


# ---------------------------------------------------------------- models


# ---------------------------------------------------------------- ranks: printed once, everyone stops


# ---------------------------------------------------------------- through torchx (-m e2e)


@pytest.mark.e2e
def test_e2e_bad_data_stops_before_anything_is_written_by_the_client_where_it_can_and_else_by_the_job(
    tmp_path: Path,
) -> None:
    rows = tmp_path / "rows.jsonl"
    lines = (REPO / "templates/data/sft_chat.jsonl").read_text().splitlines()
    # the closing brace of line 5
    lines[4] = lines[4][:-1]
    rows.write_text("\n".join(lines) + "\n")
    output_dir = tmp_path / "out"
    result = run_template("sft/tiny.yaml", tmp_path, output_dir, overrides=[f"data.train.path={rows}"])
    assert (
        result.returncode == 1
        and result.stderr == f"data.train.path: {rows} line 5 is not valid JSON (Expecting ',' delimiter, column 145)\n"
        and "local_cwd://" not in result.stdout
        # the client's line; nothing scheduled
    )
    # a value only the job reads
    lines[4] = json.dumps({"messages": "hello"})
    rows.write_text("\n".join(lines) + "\n")
    result = run_template("sft/tiny.yaml", tmp_path, output_dir, overrides=[f"data.train.path={rows}"])
    assert_stopped_once(result, "data.train: column messages holds text in row 5")
    assert not output_dir.exists() or not any(output_dir.iterdir())


@pytest.mark.e2e
def test_e2e_a_nan_reward_on_one_rank_stops_every_rank_with_its_name_and_step(tmp_path: Path) -> None:
    module_dir = tmp_path / "user_code"
    module_dir.mkdir()
    (module_dir / "flaky_rewards.py").write_text(
        textwrap.dedent("""
        import math, os

        calls = 0

        def flaky(completions, **columns):
            global calls
            calls += 1
            if os.environ["RANK"] == "1" and calls == 3:
                return [math.nan] * len(completions)
            return [float("blue" in str(c)) for c in completions]
    """)
    )
    result = run_template(
        "grpo/tiny.yaml",
        tmp_path,
        tmp_path / "out",
        overrides=["rewards=[{function: 'flaky_rewards:flaky'}]"],
        PYTHONPATH=str(module_dir),
    )
    logs = assert_stopped_once(result, "rewards.0 (flaky): returned nan at step 3")
    # the bad step is never logged
    assert "step 3/" not in logs


# user code that ends its process or never returns; each is the reward of a one-step GRPO
STOPPING_REWARDS = """
import os, sys, time

if os.environ.get("EXIT_ON_IMPORT"):
    sys.exit(0)


def stuck(completions, **columns):
    time.sleep(3600)


def quits(completions, **columns):
    sys.exit(0)


def vanishes(completions, **columns):
    os._exit(0)
"""


@pytest.mark.e2e
@pytest.mark.parametrize(
    "reward, env, message",
    [
        (
            "stuck",
            {},
            "rewards.0 (stuck) did not return within 2 s (rewards.0.timeout_s); the job stops: make it return sooner, "
            "or give it longer (rewards.0.timeout_s)",
        ),
        (
            "quits",
            {},
            "rewards.0 (quits) called sys.exit(0): the job stops; user code returns (or raises), it does not end the "
            "process",
        ),
        (
            "quits",
            {"EXIT_ON_IMPORT": "1"},
            "rank 0: sys.exit(0) was called in <module> (stopping_rewards.py:5) while the job ran; the job stops",
        ),
        (
            "vanishes",
            {},
            "1 of this node's 1 rank(s) ended with exit code 0 before their run finished (os._exit in user code, or a "
            "process ended from outside): the job did not finish",
        ),
    ],
)
def test_e2e_user_code_that_exits_or_never_returns_ends_the_job_in_one_line_never_in_success(
    tmp_path: Path, reward: str, env: dict, message: str
) -> None:
    module_dir = tmp_path / "user_code"
    module_dir.mkdir()
    (module_dir / "stopping_rewards.py").write_text(STOPPING_REWARDS)
    output_dir = tmp_path / "out"
    result = run_template(
        "grpo/tiny.yaml",
        tmp_path,
        output_dir,
        "1x1",
        overrides=[f"rewards=[{{function: 'stopping_rewards:{reward}', timeout_s: 2}}]", "training.max_steps=1"],
        PYTHONPATH=str(module_dir),
        **env,
    )
    assert_stopped_once(result, message)
    assert not (output_dir / "run_summary.json").exists()


@pytest.mark.e2e
def test_e2e_a_missing_chain_stage_names_the_run_that_writes_it(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    result = run_template("sft/tiny.yaml", tmp_path, output_dir, overrides=["model.name_or_path=outputs/nope-stage"])
    assert_stopped_once(result, "model.name_or_path: no such directory: outputs/nope-stage")
    assert "it is written by an earlier run" in result.stderr and not output_dir.exists()
