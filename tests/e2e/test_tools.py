"""Tools through the real ``torchx run``: templates/chain/lamp-tiny.yaml, where GRPO teaches the tiny model to
call a tool because only the call earns the reward. (The tool's result read back into the answer, and generation
in vLLM: tests/e2e/test_vllm.py.)"""

import json
from pathlib import Path

import pytest

from helpers import CHAIN_PORTS, assert_succeeded, ends, free_port, torchx

pytestmark = pytest.mark.e2e


def test_grpo_teaches_the_model_to_switch_the_lamp_on(tmp_path: Path) -> None:
    output_dir = tmp_path / "lamp"
    args = ["run", "-s", "local_cwd", "posttrain.chain", "--spec", "templates/chain/lamp-tiny.yaml", "-j", "1x2"]
    args += ["--rdzv_port", str(free_port(CHAIN_PORTS)), f"output_dir={output_dir}"]
    assert_succeeded(torchx(args, tmp_path, timeout=900))
    grpo = output_dir / "grpo"
    # the lamp's own reward: on only where the rollout called switch_on
    first, last = ends(grpo, "rewards/Lamp/mean")
    assert last - first >= 0.3, (first, last)
    assert ends(grpo, "tools/call_frequency")[1] > 0.5
    for line in (grpo / "samples.jsonl").read_text().splitlines():
        sample = json.loads(line)
        called = any(message["role"] == "tool" for message in sample["completion"])
        assert sample["rewards"]["Lamp"] == float(called), sample
