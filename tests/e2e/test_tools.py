"""Tools through the real ``torchx run``: templates/chain/tools-tiny.yaml teaches the tiny model the call (SFT on
demonstrations), then GRPO runs it with the environment whose tool it calls, on two processes. (With vLLM:
tests/e2e/test_vllm.py.)"""

from pathlib import Path

import pytest

from helpers import CHAIN_PORTS, assert_calls_the_rooms_tool, assert_succeeded, ends, free_port, torchx

pytestmark = pytest.mark.e2e


def test_the_tools_chain_teaches_the_call_and_grpo_runs_the_rooms_tool(tmp_path: Path) -> None:
    output_dir = tmp_path / "tools"
    args = ["run", "-s", "local_cwd", "posttrain.chain", "--spec", "templates/chain/tools-tiny.yaml", "-j", "1x2"]
    args += ["--rdzv_port", str(free_port(CHAIN_PORTS)), f"output_dir={output_dir}"]
    assert_succeeded(torchx(args, tmp_path, timeout=900))
    first, last = ends(output_dir / "sft", "loss")
    assert last < first / 4
    assert_calls_the_rooms_tool(output_dir / "grpo")
