"""One run per output directory, with real processes holding the lease: a second run is refused naming the holder,
a holder that is gone is taken over (by one run of two racing), and a later attempt of the same job takes its lease
back.

Holders beat every 0.2 s here, and a silent holder is gone after 1.5 s (the job's: 5 s and 60 s).
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import HEARTBEAT_S, STALE_S
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.process import lease
from posttrain.entrypoints.process.lease import LEASE_FILE, Holder, acquire, alive_at_once, gone_at_once, read_holder

SETTINGS = (
    f"from posttrain.entrypoints.process import lease; lease.HEARTBEAT_S = {HEARTBEAT_S}; lease.STALE_S = {STALE_S}"
)


HOLD = f"""
import sys, time
from pathlib import Path
{SETTINGS}
held = lease.acquire(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(60)
"""


# a newcomer in a process of its own: what it says, on one line
TRY = f"""
import sys
from pathlib import Path
{SETTINGS}
from posttrain.components.spec.messages import SpecError
try:
    lease.acquire(Path(sys.argv[1]))
    print("took it", flush=True)
except SpecError as error:
    print("refused:", error, flush=True)
"""


pytestmark = pytest.mark.usefixtures("short_intervals")


def holding_process(output_dir: Path, *prefix: str, **env: str) -> subprocess.Popen:
    """Another process (under ``prefix``, e.g. ``unshare``) that takes the lease on ``output_dir`` and keeps it."""
    process = subprocess.Popen(
        [*prefix, sys.executable, "-c", HOLD, str(output_dir)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline() == "held\n"
    return process


def foreign_lease(output_dir: Path, **fields: object) -> dict:
    """A lease as a run on another host wrote it; its timestamps say nothing anyone may trust."""
    data = {
        "job": "7781",
        "attempt": [0, 0],
        "host": "node-elsewhere",
        "pid": 1,
        "pid_start": 1,
        "process_space": "other-boot/pid:[1]",
        # its clock a day ahead
        "since": time.time() + 86400,
        "beat": 40,
        "token": "f" * 16,
        **fields,
    }
    (output_dir / LEASE_FILE).write_text(json.dumps(data))
    return data


def test_a_second_run_into_a_held_directory_is_refused_naming_the_holder(tmp_path: Path) -> None:
    holder = holding_process(tmp_path, TORCHELASTIC_RUN_ID="sft-abc")
    try:
        with pytest.raises(SpecError) as error:
            acquire(tmp_path)
        message = str(error.value)
        assert message.startswith(f"training.output_dir: {tmp_path} is held by job sft-abc on host ")
        assert f"(pid {holder.pid}) since " in message
        assert message.endswith(
            "whose heartbeat goes on; wait for it, stop it, or use another output_dir (a holder whose heartbeat "
            "stops for 2 s is taken over)"
        )
    finally:
        holder.kill()
        holder.wait()


def test_a_holder_whose_process_is_gone_is_taken_over_at_once_with_a_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    holder = holding_process(tmp_path)
    # no release: the lease file stays
    holder.kill()
    holder.wait()
    assert read_holder(tmp_path).pid == holder.pid
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="posttrain"):
        acquire(tmp_path).release()
    # the process is known gone: nothing to watch
    assert time.monotonic() - started < STALE_S
    [line] = caplog.messages
    assert line.startswith(f"training.output_dir: took over {tmp_path}: job pid-{holder.pid} on host ")
    assert line.endswith("held it, and that process is gone") and f"(pid {holder.pid}) since " in line


def test_a_holder_in_another_pid_namespace_is_judged_by_its_heartbeat_not_its_pid(tmp_path: Path) -> None:
    """A container that shares the host name (host networking) shares no process ids: the holder's pid means
    nothing here, whatever process has it."""
    holder = holding_process(tmp_path, "unshare", "--pid", "--fork", "--mount-proc")
    try:
        found = read_holder(tmp_path)
        assert found.host == Holder.this_process().host and found.process_space != lease.process_space()
        assert gone_at_once(found, Holder.this_process()) is None
        with pytest.raises(SpecError, match="whose heartbeat goes on"):
            acquire(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    # no such process here; not proof of anything there
    dead = Holder(**{**vars(found), "pid": 999_999_999})
    assert gone_at_once(dead, Holder.this_process()) is None and not alive_at_once(dead, Holder.this_process())


def test_a_holder_on_another_host_is_gone_when_its_heartbeat_stops_whatever_its_clock_says(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = foreign_lease(tmp_path)
    beating, stop = threading.Event(), threading.Event()

    # the holder, alive: a new beat every 0.2 s (its timestamps a day ahead all along)
    def beat() -> None:
        count = data["beat"]
        while not stop.wait(HEARTBEAT_S):
            count += 1
            (tmp_path / f"{LEASE_FILE}.tmp").write_text(json.dumps({**data, "beat": count}))
            os.replace(tmp_path / f"{LEASE_FILE}.tmp", tmp_path / LEASE_FILE)
            beating.set()

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        beating.wait(5)
        with pytest.raises(SpecError, match=r"is held by job 7781 on host node-elsewhere \(pid 1\) since "):
            acquire(tmp_path)
    finally:
        stop.set()
        thread.join()
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="posttrain"):
        acquire(tmp_path).release()
    # watched on this host's own clock
    assert time.monotonic() - started >= STALE_S
    assert caplog.messages[-1].endswith("held it, and its heartbeat did not change for 2 s")


def test_two_runs_in_one_slurm_allocation_are_two_jobs(tmp_path: Path) -> None:
    """Two local_cwd runs in one salloc shell share SLURM_JOB_ID, not torchx's app id: the second is refused,
    even as a torchrun restart (which a later attempt of the same job would take the lease back as)."""
    holder = holding_process(tmp_path, SLURM_JOB_ID="4242", TORCHELASTIC_RUN_ID="sft-first")
    try:
        env = {**os.environ, "SLURM_JOB_ID": "4242", "TORCHELASTIC_RUN_ID": "sft-second"}
        env["TORCHELASTIC_RESTART_COUNT"] = "1"
        newcomer = subprocess.run(
            [sys.executable, "-c", TRY, str(tmp_path)], env=env, capture_output=True, text=True, timeout=60
        )
        assert newcomer.stdout.startswith(f"refused: training.output_dir: {tmp_path} is held by job sft-first ")
        assert holder.poll() is None and read_holder(tmp_path).job == "sft-first"
    finally:
        holder.kill()
        holder.wait()
    # torchx on Slurm leaves the run id as the literal macro: the allocation's job and step name the job there
    slurm = {"TORCHELASTIC_RUN_ID": "$SLURM_JOB_ID", "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in slurm.items():
            patch.setenv(key, value)
        assert lease.job_name() == "slurm-4242.0"


def test_two_runs_taking_over_one_gone_holder_at_once_one_takes_it(tmp_path: Path) -> None:
    # silent: both judge it gone after 1.5 s, and race
    foreign_lease(tmp_path)
    newcomers = [
        subprocess.Popen(
            [sys.executable, "-c", TRY + "\nimport time; time.sleep(3)", str(tmp_path)],
            env={**os.environ, "TORCHELASTIC_RUN_ID": f"run-{n}"},
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(2)
    ]
    said = sorted(newcomer.communicate(timeout=60)[0].splitlines()[0] for newcomer in newcomers)
    assert said[1] == "took it" and said[0].startswith(f"refused: training.output_dir: {tmp_path} is held by job run-")


def test_a_later_attempt_of_the_same_job_takes_its_lease_back_and_the_earlier_one_stops(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    output_dir = tmp_path / "out"
    earlier = holding_process(
        output_dir,
        TORCHELASTIC_RUN_ID="grpo-x1",
        TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_ERROR_FILE=str(error_file),
    )
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("TORCHELASTIC_RUN_ID", "grpo-x1")
            env.setenv("TORCHELASTIC_RESTART_COUNT", "1")
            held = acquire(output_dir)
        # the earlier attempt (say, a requeue racing an old allocation) finds it taken at its next heartbeat
        assert earlier.wait(timeout=10) == 2
        assert read_holder(output_dir).token == held.holder.token
        held.release()
    finally:
        earlier.kill()
    line = json.loads(error_file.read_text())["message"]["message"]
    assert line.startswith(f"posttrain: training.output_dir: {output_dir} was taken over by job grpo-x1 on host ")
    assert line.endswith("; this job stops")
