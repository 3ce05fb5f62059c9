"""Tools through the real ``torchx run``: templates/chain/tool-use-tiny.yaml, where GRPO teaches the tiny model
to call tools because only the calls earn the reward: one call for the lamp, two in order for the safe. (A tool's
result read back into the answer, and generation in vLLM: tests/e2e/test_vllm.py.)"""

import json
from pathlib import Path

import pytest

from helpers import CHAIN_PORTS, assert_succeeded, ends, free_port, torchx

pytestmark = pytest.mark.e2e


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
