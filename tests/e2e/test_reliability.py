"""Reliability and security through real jobs: input only the job can tell stops it before the model loads; a
crashing or hanging rank ends the job in bounded time with its traceback kept; restarts and preemption resume;
spec values reach the job byte for byte and run nothing. (Bad input at submit: ``tests/unit/spec/test_reliability.py``.)
"""

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, List, Tuple

import pytest

from helpers import (
    assert_stopped_once,
    assert_succeeded,
    free_port,
    read_json,
    run_template,
    start_training,
)
from posttrain.entrypoints.records.checkpoints import checkpoint_steps, complete_checkpoints
from posttrain.entrypoints.records.files import file_problem

SFT = "templates/sft/tiny.yaml"


# ---------------------------------------------------------------- checks only the job can make


def job_logs(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


@pytest.mark.e2e
@pytest.mark.parametrize(
    "overrides, message",
    [
        # one launch per mechanism: the data checks and the model loader (the rest of their messages in process below)
        (["data.train.path=/mnt/shared/nope.jsonl"], "data.train.path: no such file: /mnt/shared/nope.jsonl"),
        (["model.name_or_path=./models/none"], "model.name_or_path: no such directory: ./models/none"),
    ],
)
def test_job_side_input_errors_end_every_rank_before_training(tmp_path: Path, overrides: list, message: str) -> None:
    result = run_template("sft/tiny.yaml", tmp_path, tmp_path / "out", overrides=overrides)
    # rank 0 alone says it; both ranks stop
    logs = assert_stopped_once(result, message)
    assert "training sft on" not in logs


# ---------------------------------------------------------------- crashes and hangs


def fault_time(logs: str) -> float:
    line = next(line for line in logs.splitlines() if "posttrain fault injection" in line)
    return float(line.rsplit("t=", 1)[1])


@pytest.mark.e2e
@pytest.mark.parametrize("fault", ["raise:1:5", "exit:1:5", "raise:0:0"])
def test_a_crashing_rank_ends_the_job_within_30_s_in_one_line_its_traceback_kept(tmp_path: Path, fault: str) -> None:
    result = run_template("sft/tiny.yaml", tmp_path, tmp_path / "out", POSTTRAIN_FAULT=fault)
    ended = time.time()
    logs = job_logs(result)
    assert result.returncode != 0
    assert ended - fault_time(logs) <= 30
    kind, rank, _ = fault.split(":")
    if kind == "raise":
        kept = tmp_path / "out" / "logs" / f"traceback-rank{rank}.txt"
        line = (
            rf"posttrain: rank {rank} crashed: RuntimeError: posttrain fault injection: raise on rank {rank} at step "
        )
        assert re.search(
            line + rf"\d+, t=[\d.]+ \(at callbacks.py:\d+ in _fire\); traceback in {re.escape(str(kept))}\n", logs
        ), logs[-3000:]
        assert "Traceback (most recent call last)" in kept.read_text() and "Traceback" not in logs
    else:
        assert re.search(rf"posttrain: rank {rank} \(pid \d+\) exited with code 13 without saying why", logs), logs[
            -3000:
        ]
    # torchx's closing status repeats the line as the app's structured error
    job = logs.partition("AppStatus:")[0]
    assert job.count("posttrain: rank") == 1 and "ChildFailedError" not in logs


@pytest.mark.e2e
def test_a_hanging_rank_ends_the_job_within_the_timeout(tmp_path: Path) -> None:
    timeout_s = 10
    result = run_template(
        "sft/tiny.yaml",
        tmp_path,
        tmp_path / "out",
        overrides=[f"distributed.timeout_s={timeout_s}"],
        POSTTRAIN_FAULT="hang:1:5",
        timeout=300,
    )
    ended = time.time()
    logs = job_logs(result)
    assert result.returncode != 0
    # the other rank's collective times out after timeout_s; torchrun then stops the hung rank
    # (SIGTERM, then SIGKILL after its 30 s grace)
    assert ended - fault_time(logs) <= timeout_s + 45
    assert f"Timed out waiting {timeout_s * 1000}ms" in logs


# ---------------------------------------------------------------- restarts, kills, preemption


@pytest.mark.e2e
def test_a_restart_resumes_from_the_last_checkpoint(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    result = run_template(
        "sft/tiny.yaml", tmp_path, output_dir, extra_args=["--max_restarts", "1"], POSTTRAIN_FAULT="exit:1:25"
    )
    assert_succeeded(result)
    summary = read_json(output_dir / "run_summary.json")
    assert summary["resumed_from"] == str(output_dir / "checkpoint-20")
    assert summary["global_steps"] == 40
    # the history is the checkpoint's steps, then the restarted attempt's: each step once, none lost
    steps = [entry["step"] for entry in read_json(output_dir / "trainer_state.json")["log_history"] if "loss" in entry]
    assert steps == list(range(1, 41))


@pytest.mark.e2e
def test_a_kill_during_a_save_leaves_the_previous_checkpoint_and_resume_ignores_the_partial_one(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    result = run_template(
        "sft/tiny.yaml", tmp_path, output_dir, extra_args=["--max_restarts", "1"], POSTTRAIN_FAULT="kill:0:40"
    )
    assert_succeeded(result)
    assert "posttrain fault injection: kill on rank 0 at step 40" in job_logs(result)
    summary = read_json(output_dir / "run_summary.json")
    assert summary["resumed_from"] == str(output_dir / "checkpoint-20"), "the partial checkpoint-40 must be skipped"
    assert summary["global_steps"] == 40


class Watching:
    """Watches ``output_dir``'s checkpoints while a run writes them: whether it ever held checkpoints and no whole
    one, once one had been whole."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        self.seen: List[Tuple[str, ...]] = []
        self.without_a_whole_one: List[Tuple[str, ...]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "Watching":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(0.002):
            names = tuple(path.name for _, path in checkpoint_steps(self.output_dir))
            whole = complete_checkpoints(self.output_dir)
            if names and (not self.seen or names != self.seen[-1]):
                self.seen.append(names)
            if self.seen and any(self.seen[:-1]) and not whole:
                self.without_a_whole_one.append(names)


@pytest.mark.e2e
def test_checkpoints_rotate_only_once_sealed_and_a_kill_in_the_final_save_finishes_from_the_last_one(
    tmp_path: Path,
) -> None:
    output_dir = tmp_path / "out"
    # a checkpoint every step, one kept: the older one goes each time the newer one is whole
    overrides = ["training.max_steps=4", "training.save_steps=1", "training.save_total_limit=1"]
    with Watching(output_dir) as watched:
        killed = run_template("sft/tiny.yaml", tmp_path, output_dir, "1x1", overrides, POSTTRAIN_FAULT="kill:0:final")
    assert killed.returncode != 0
    assert "posttrain fault injection: kill on rank 0 at the final save" in job_logs(killed)
    # at every moment after the first checkpoint was whole, a whole one was there to resume from
    assert watched.without_a_whole_one == [] and len(watched.seen) >= 4, watched.seen
    # mid-way: one file of the final model moved in, the rest still staged, and nothing says the run finished
    assert not (output_dir / "run_summary.json").exists()
    assert any((output_dir / ".posttrain-final").iterdir())
    last = output_dir / "checkpoint-4"
    # the only checkpoint is the last step's
    assert [path for _, path in checkpoint_steps(output_dir)] == complete_checkpoints(output_dir) == [last]
    trained = read_json(last / "trainer_state.json")["log_history"]

    again = run_template("sft/tiny.yaml", tmp_path, output_dir, "1x1", overrides)
    assert_succeeded(again)
    assert f"{last} is the run's last step, and the run did not end: finishing from it, no step trained" in (
        job_logs(again)
    )
    summary = read_json(output_dir / "run_summary.json")
    assert summary["resumed_from"] == str(last) and summary["global_steps"] == 4
    # no step trained again: the history is the killed run's, the final model the last checkpoint's weights
    losses = [entry for entry in read_json(output_dir / "trainer_state.json")["log_history"] if "loss" in entry]
    assert losses == [entry for entry in trained if "loss" in entry] and [e["step"] for e in losses] == [1, 2, 3, 4]
    assert (output_dir / "model.safetensors").read_bytes() == (last / "model.safetensors").read_bytes()
    assert not (output_dir / ".posttrain-final").exists() and file_problem(output_dir / "model.safetensors") is None


@pytest.mark.e2e
def test_sigterm_saves_a_checkpoint_and_the_next_run_resumes_from_it(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    log_path = tmp_path / "job.log"
    args = [
        "run",
        "-s",
        "local_cwd",
        "posttrain.sft",
        "--spec",
        SFT,
        "--rdzv_port",
        str(free_port()),
        f"training.output_dir={output_dir}",
        "training.max_steps=3000",
        "training.save_steps=100000",
    ]
    job = start_training(args, tmp_path, log_path, steps=5)
    try:
        agent = subprocess.run(
            ["pgrep", "-f", f"posttrain.entrypoints.launcher .*{output_dir}"], capture_output=True, text=True
        ).stdout.split()
        assert agent, "the torchrun agent was not found"
        # what a scheduler's preemption does
        os.kill(int(agent[0]), signal.SIGTERM)
        job.wait(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    logs = log_path.read_text()
    assert job.returncode != 0
    assert "SIGTERM: saved checkpoint-" in logs
    # one line, the launcher's, also torchx's structured error; no torchrun traceback
    stopped = subprocess.CompletedProcess(args, job.returncode, logs, "")
    assert_stopped_once(stopped, "stopped by SIGTERM: the ranks were told to save a checkpoint")
    assert "Traceback" not in logs, logs[-4000:]
    checkpoints = list(output_dir.glob("checkpoint-*"))
    assert len(checkpoints) == 1
    saved_step = read_json(checkpoints[0] / "trainer_state.json")["global_step"]
    assert 5 <= saved_step < 3000

    # a changed max_steps is a different spec, so the checkpoint is named explicitly
    resumed = run_template(
        "sft/tiny.yaml",
        tmp_path,
        output_dir,
        overrides=[f"training.max_steps={saved_step + 3}", f"resume={checkpoints[0]}"],
    )
    assert_succeeded(resumed)
    summary = read_json(output_dir / "run_summary.json")
    assert summary["resumed_from"] == str(checkpoints[0]) and summary["global_steps"] == saved_step + 3


# ---------------------------------------------------------------- injection and secrets

NASTY = 'it\'s "quoted"; $(touch {sentinel}) `touch {sentinel}` && echo $HOME \\ ünïcödé ${{app_id}}\nsecond line'


@pytest.mark.e2e
def test_spec_values_reach_the_job_byte_exactly_and_run_nothing(tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    nasty = NASTY.format(sentinel=sentinel)
    output_dir = tmp_path / "out"
    secret = "hf_posttrain_test_secret_value"
    result = run_template(
        "sft/tiny.yaml",
        tmp_path,
        output_dir,
        overrides=["training.max_steps=2", f"training.run_name={nasty}"],
        HF_TOKEN=secret,
        WANDB_API_KEY=secret,
    )
    assert_succeeded(result)
    assert not sentinel.exists(), "a spec value was executed"
    assert read_json(output_dir / "run_summary.json")["spec"]["training"]["run_name"] == nasty
    assert read_json(output_dir / "posttrain_spec.json")["training"]["run_name"] == nasty
    # secrets travel in the environment only: never in args, the spec, the outputs or the logs
    assert secret not in job_logs(result)
    for path in output_dir.rglob("*.json"):
        assert secret not in path.read_text(), path
