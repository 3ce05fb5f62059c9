"""A verifiers 0.4.0 environment trains and judges a model through ``torchx run`` (templates/chain/verifiers-tiny
.yaml): verifiers' own harness plays each episode in a process of its own through the job's endpoint, scored by the
taskset's reward."""

from pathlib import Path

import pytest

from helpers import CHAIN_PORTS, assert_succeeded, ends, free_port, read_json, series, torchx

pytestmark = pytest.mark.e2e


def test_grpo_in_a_verifiers_environment_raises_its_reward_and_the_environment_judges_the_models(
    tmp_path: Path,
) -> None:
    """SFT warm start, GRPO whose rollouts are the taskset's episodes, then the gate where the same environment
    judges both models: the reward rises by 0.3 in training and by 0.15 in the judging, and no episode failed."""
    output_dir = tmp_path / "verifiers"
    args = ["run", "-s", "local_cwd", "posttrain.chain", "--spec", "templates/chain/verifiers-tiny.yaml", "-j", "1x1"]
    args += ["--rdzv_port", str(free_port(CHAIN_PORTS)), f"output_dir={output_dir}"]
    assert_succeeded(torchx(args, tmp_path, timeout=900))

    first, last = ends(output_dir / "grpo", "rewards/say_digit/mean")
    assert last - first >= 0.3, (first, last)
    assert set(series(output_dir / "grpo", "agent/errors")) == {0}
    # the taskset's own reward, said, as the episode's metric
    assert series(output_dir / "grpo", "agent/said") == series(output_dir / "grpo", "rewards/say_digit/mean")

    summary = read_json(output_dir / "check" / "eval_summary.json")
    assert [verdict["held"] for verdict in summary["require"]] == [True], summary["require"]
    for model in ("sft", "grpo"):
        assert summary["models"][model]["say_digit"]["samples"] == 20
        assert summary["episodes"][model]["errors"] == 0
