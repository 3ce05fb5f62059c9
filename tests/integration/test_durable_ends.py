"""A damaged chain record, read by the chain's own process: one line, exit 2, no traceback."""

import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO
from posttrain.components.spec.chain import load_chain


def test_a_damaged_chain_record_ends_the_chain_in_one_line(tmp_path: Path) -> None:
    chain = load_chain(str(REPO / "templates/chain/sft-dpo-tiny.yaml"), [f"output_dir={tmp_path}"], world_size=1)
    # the chain's process, for real: no traceback
    (tmp_path / "chain.json").write_text('{"stages": {"sft": {"spe')
    args = ["--spec-json", chain.to_json(), "--node", "0", "--rank0-host", "localhost", "--", "--rdzv_id", "x"]
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json")}
    result = subprocess.run(
        [sys.executable, "-m", "posttrain.entrypoints.chain", *args], capture_output=True, text=True, env=env
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"posttrain: {tmp_path / 'chain.json'} is cut short or not what posttrain wrote; remove it (the chain then "
        "runs every stage again) or use another output_dir"
    ]
