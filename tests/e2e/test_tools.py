"""Tools through the real ``torchx run``, GRPO teaching the tiny model to use them: templates/chain/tools-tiny.yaml,
where the answer is only known from the tool's result, and templates/chain/tool-use-tiny.yaml, where only the calls
earn the reward: one call for the lamp, two in order for the safe. (Generation in vLLM: tests/e2e/test_vllm.py.)"""

import json
from pathlib import Path

import pytest

from helpers import CHAIN_PORTS, assert_calls_the_rooms_tool, assert_succeeded, ends, free_port, run_template, torchx

pytestmark = pytest.mark.e2e


def test_grpo_teaches_the_model_to_read_the_value_it_can_only_know_from_the_tool(tmp_path: Path) -> None:
    """Each room hides a digit drawn per row. The SFT model peeks in about a third of its answers and guesses the
    rest; GRPO raises the reward by 0.3 as it learns to peek and answer what it read. A run without the tool, from
    the same SFT model, stays at a guess's one in ten or below: the task needs the tool."""
    output_dir = tmp_path / "tools"
    args = ["run", "-s", "local_cwd", "posttrain.chain", "--spec", "templates/chain/tools-tiny.yaml", "-j", "1x2"]
    args += ["--rdzv_port", str(free_port(CHAIN_PORTS)), f"output_dir={output_dir}"]
    assert_succeeded(torchx(args, tmp_path, timeout=900))
    first, last = ends(output_dir / "grpo", "rewards/exact_match/mean")
    assert last - first >= 0.3, (first, last)
    assert_calls_the_rooms_tool(output_dir / "grpo")

    without_tool = tmp_path / "without-tool"
    # a guess stays a guess: 10 steps say so as well as 40
    overrides = [f"model.name_or_path={output_dir / 'sft'}", "~environment", "~training.max_tool_calling_iterations"]
    overrides += ["training.max_steps=10"]
    assert_succeeded(run_template("grpo/tiny-tools.yaml", tmp_path, without_tool, overrides=overrides))
    guessed = ends(without_tool, "rewards/exact_match/mean")[1]
    assert guessed < 0.35 and last - guessed >= 0.5, (guessed, last)


def test_grpo_teaches_the_model_to_switch_the_lamp_on_and_to_open_the_safe(tmp_path: Path) -> None:
    output_dir = tmp_path / "tool-use"
    args = ["run", "-s", "local_cwd", "posttrain.chain", "--spec", "templates/chain/tool-use-tiny.yaml", "-j", "1x2"]
    args += ["--rdzv_port", str(free_port(CHAIN_PORTS)), f"output_dir={output_dir}"]
    assert_succeeded(torchx(args, tmp_path, timeout=900))
    # each environment's own reward, the calls a rollout needs for it, and the result of the last of them
    tasks = (("lamp", "Lamp", 1, "The lamp is on."), ("safe", "Safe", 2, "The door is open."))
    for stage, environment, calls, done in tasks:
        first, last = ends(output_dir / stage, f"rewards/{environment}/mean")
        assert last - first >= 0.3, (stage, first, last)
        assert ends(output_dir / stage, "tools/call_frequency")[1] > 0.5 * calls
        for line in (output_dir / stage / "samples.jsonl").read_text().splitlines():
            sample = json.loads(line)
            results = [message["content"] for message in sample["completion"] if message["role"] == "tool"]
            assert sample["rewards"][environment] == float(done in results), sample
