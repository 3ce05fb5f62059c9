"""A failed job ends with one line, through the real torchx run: a reward function raising on every rank."""

import re
import textwrap
from pathlib import Path

import pytest

from helpers import assert_stopped_once, run_template


@pytest.mark.e2e
def test_e2e_a_reward_function_that_raises_on_every_rank_ends_in_one_line(tmp_path: Path) -> None:
    module_dir = tmp_path / "user_code"
    module_dir.mkdir()
    (module_dir / "judge.py").write_text(
        textwrap.dedent("""
        calls = 0

        def score(completions, **columns):
            global calls
            calls += 1
            if calls == 2:
                raise ConnectionError("the judge at http://judge:8000 went away")
            return [float("blue" in str(c)) for c in completions]
    """)
    )
    output_dir = tmp_path / "out"
    result = run_template(
        "grpo/tiny.yaml",
        tmp_path,
        output_dir,
        overrides=["rewards=[{function: 'judge:score'}]"],
        PYTHONPATH=str(module_dir),
    )
    logs = assert_stopped_once(result, "rank ")
    line = re.search(
        r"posttrain: rank (\d) crashed: ConnectionError: the judge at http://judge:8000 went away "
        r"\(at judge.py:8 in score\); traceback in (\S+)\n",
        logs,
    )
    assert line, logs[-3000:]
    assert "went away" in Path(line[2]).read_text() and Path(line[2]).parent == output_dir / "logs"


@pytest.mark.e2e
def test_e2e_a_connection_reset_in_a_reward_function_is_its_crash_not_a_lost_peer(tmp_path: Path) -> None:
    # a lost peer is quiet (another rank says why); a user's "Connection reset by peer" is not one, even on one rank
    module_dir = tmp_path / "user_code"
    module_dir.mkdir()
    (module_dir / "judge.py").write_text(
        textwrap.dedent("""
        def score(completions, **columns):
            raise ConnectionResetError("Connection reset by peer")
    """)
    )
    output_dir = tmp_path / "out"
    result = run_template(
        "grpo/tiny.yaml",
        tmp_path,
        output_dir,
        j="1x1",
        overrides=["rewards=[{function: 'judge:score'}]", "training.max_steps=2"],
        PYTHONPATH=str(module_dir),
    )
    logs = assert_stopped_once(
        result, "rank 0 crashed: ConnectionResetError: Connection reset by peer (at judge.py:3 in score)"
    )
    # torchx's closing status (YAML, its lines folded)
    status = " ".join(logs.partition("AppStatus:")[2].split())
    assert "message: 'posttrain: rank 0 crashed: ConnectionResetError: Connection reset by peer" in status, status
    assert "Connection reset by peer" in (output_dir / "logs" / "traceback-rank0.txt").read_text()
