"""One run per output directory: the lease, with real processes holding it."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints import lease
from posttrain.entrypoints.lease import LEASE_FILE, acquire, read_holder

HOLD = """
import sys, time
from pathlib import Path
from posttrain.entrypoints import lease
lease.HEARTBEAT_S = 0.2
held = lease.acquire(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(60)
"""


def holding_process(output_dir: Path, **env: str) -> subprocess.Popen:
    """Another process that takes the lease on ``output_dir`` and keeps it (heartbeat every 0.2 s)."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(output_dir)], env={**os.environ, **env}, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline() == "held\n"
    return process


def test_a_lease_is_held_while_its_run_lives_and_given_back_with_the_directory_it_made(tmp_path: Path) -> None:
    output_dir = tmp_path / "new" / "out"
    held = acquire(output_dir)
    holder = read_holder(output_dir)
    assert (holder.pid, holder.token) == (os.getpid(), held.holder.token)
    held.release()
    assert not (tmp_path / "new" / "out").exists()  # the run made it and wrote nothing else
    output_dir.mkdir()
    (output_dir / "model.safetensors").write_text("kept")
    acquire(output_dir).release()
    assert sorted(p.name for p in output_dir.iterdir()) == ["model.safetensors"]


def test_a_second_run_into_a_held_directory_is_refused_naming_the_holder(tmp_path: Path) -> None:
    holder = holding_process(tmp_path, TORCHELASTIC_RUN_ID="sft-abc")
    try:
        with pytest.raises(SpecError) as error:
            acquire(tmp_path)
        message = str(error.value)
        assert message.startswith(f"training.output_dir: {tmp_path} is held by job sft-abc on host ")
        assert f"(pid {holder.pid}) since " in message
        assert message.endswith(
            "wait for it, stop it, or use another output_dir (a holder silent for 60 s is taken over)"
        )
    finally:
        holder.kill()
        holder.wait()


def test_a_holder_whose_process_is_gone_is_taken_over_with_a_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    holder = holding_process(tmp_path)
    holder.send_signal(signal.SIGKILL)  # no release: the lease file stays
    holder.wait()
    assert read_holder(tmp_path).pid == holder.pid
    with caplog.at_level("WARNING", logger="posttrain"):
        acquire(tmp_path).release()
    [line] = caplog.messages
    assert line.startswith(f"training.output_dir: took over {tmp_path}: job pid-{holder.pid} on host ")
    assert line.endswith("held it, and that process is gone") and f"(pid {holder.pid}) since " in line


def test_a_holder_on_another_host_is_taken_over_only_when_silent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    elsewhere = {
        "job": "7781",
        "attempt": [0, 0],
        "host": "node-elsewhere",
        "pid": 1,
        "since": time.time() - 100,
        "heartbeat": time.time() - 5,
        "token": "f" * 16,
    }
    (tmp_path / LEASE_FILE).write_text(json.dumps(elsewhere))
    with pytest.raises(SpecError, match="is held by job 7781 on host node-elsewhere .* last heartbeat 5 s ago"):
        acquire(tmp_path)
    (tmp_path / LEASE_FILE).write_text(json.dumps({**elsewhere, "heartbeat": time.time() - lease.STALE_S - 1}))
    with caplog.at_level("WARNING", logger="posttrain"):
        acquire(tmp_path).release()
    assert caplog.messages[0].endswith("held it, silent for 61 s")


def test_a_later_attempt_of_the_same_job_takes_its_lease_back_and_the_earlier_one_stops(tmp_path: Path) -> None:
    earlier = holding_process(tmp_path, TORCHELASTIC_RUN_ID="grpo-x1", TORCHELASTIC_RESTART_COUNT="0")
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("TORCHELASTIC_RUN_ID", "grpo-x1")
            env.setenv("TORCHELASTIC_RESTART_COUNT", "1")
            held = acquire(tmp_path)
        # the earlier attempt (say, a requeue racing an old allocation) finds it taken at its next heartbeat
        assert earlier.wait(timeout=10) == 2
        assert read_holder(tmp_path).token == held.holder.token
        held.release()
    finally:
        earlier.kill()
