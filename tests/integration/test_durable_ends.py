"""Records written whole and held alone, through real processes: a damaged chain record and a chain whose directory
another chain holds end the chain's own process in one line (exit 2, no traceback); two processes writing one record
never share a temporary file."""

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO
from posttrain.components.spec.chain import load_chain
from posttrain.entrypoints.process.lease import LEASE_FILE


def run_chain(chain_json: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """The chain's process on node 0, for real."""
    args = ["--spec-json", chain_json, "--node", "0", "--rank0-host", "localhost", "--", "--rdzv_id", "x"]
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json")}
    return subprocess.run(
        [sys.executable, "-m", "posttrain.entrypoints.chain", *args], capture_output=True, text=True, env=env
    )


def test_a_damaged_chain_record_ends_the_chain_in_one_line(tmp_path: Path) -> None:
    chain = load_chain(str(REPO / "templates/chain/sft-dpo-tiny.yaml"), [f"output_dir={tmp_path}"], world_size=1)
    (tmp_path / "chain.json").write_text('{"stages": {"sft": {"spe')
    result = run_chain(chain.to_json(), tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"posttrain: {tmp_path / 'chain.json'} is cut short or not what posttrain wrote; remove it (the chain then "
        "runs every stage again) or use another output_dir"
    ]


def test_a_second_chain_into_a_held_directory_is_refused_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    chain = load_chain(str(REPO / "templates/chain/sft-dpo-tiny.yaml"), [f"output_dir={tmp_path}"], world_size=1)
    # the first chain, alive: its process holds the directory
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from posttrain.entrypoints.process import lease; "
            "lease.acquire(Path(sys.argv[1]), key='output_dir'); print('held', flush=True); time.sleep(120)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        result = run_chain(chain.to_json(), tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(f"posttrain: output_dir: {tmp_path} is held by job ")
    assert f"(pid {holder.pid})" in line
    assert json.loads((tmp_path / "error.json").read_text())["message"]["message"] == line
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(["error.json", LEASE_FILE])


WRITER = """
import sys
from pathlib import Path
from posttrain.entrypoints.records.files import write_json_atomic
for round in range(300):
    write_json_atomic(Path(sys.argv[1]), {"writer": sys.argv[2], "round": round, "rows": list(range(2000))})
"""


def test_two_processes_writing_one_record_never_share_a_temporary_file(tmp_path: Path) -> None:
    record = tmp_path / "chain.json"
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(record), name], stderr=subprocess.PIPE, text=True)
        for name in ("a", "b")
    ]
    seen = set()
    while any(writer.poll() is None for writer in writers):
        if record.exists():
            # whole at every moment: one writer's or the other's
            seen.add(json.loads(record.read_text())["writer"])
    errors = [writer.stderr.read() for writer in writers]
    assert [writer.returncode for writer in writers] == [0, 0], errors
    assert seen <= {"a", "b"} and json.loads(record.read_text())["rows"] == list(range(2000))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["chain.json"]
