"""One run per output directory, through the real ``torchx run``: two clients racing, a client that dies; what a
failed job says, through torchx's own channels."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import REPO, assert_stopped_once, assert_succeeded, free_port, job_env, read_json, start_training, torchx
from posttrain.entrypoints.process.lease import LEASE_FILE
from posttrain.entrypoints.records.checkpoints import complete_checkpoints


def sft_args(output_dir: Path, *overrides: str, j: str = "1x2", port: int = 0) -> list:
    return [
        "run",
        "-s",
        "local_cwd",
        "posttrain.sft",
        "--spec",
        "templates/sft/tiny.yaml",
        "-j",
        j,
        "--rdzv_port",
        str(port or free_port()),
        f"training.output_dir={output_dir}",
        *overrides,
    ]


@pytest.mark.e2e
def test_two_runs_started_at_once_into_one_directory_one_trains_and_the_other_is_refused(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    rates = ("3e-3", "1e-3")
    clients = [
        subprocess.Popen(
            [str(Path(sys.executable).parent / "torchx"), *sft_args(output_dir, f"training.learning_rate={rate}")],
            cwd=REPO,
            env=job_env(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rate in rates
    ]
    outputs = [client.communicate(timeout=600)[0] for client in clients]
    codes = [client.returncode for client in clients]
    assert sorted(codes) == [0, 1], outputs
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    # what the job printed, and torchx's closing status
    job, _, status = outputs[loser].partition("AppStatus:")
    refusal = [line for line in job.splitlines() if "posttrain: " in line]
    assert len(refusal) == 1 and f"posttrain: training.output_dir: {output_dir} is held by job sft-" in refusal[0]
    assert "wait for it, stop it, or use another output_dir" in refusal[0]
    # the app's structured error
    assert "posttrain: training.output_dir: " in status
    # the directory is the winner's alone: its spec, each step once, and no lease left behind
    assert read_json(output_dir / "posttrain_spec.json")["training"]["learning_rate"] == float(rates[winner])
    steps = [entry["step"] for entry in read_json(output_dir / "trainer_state.json")["log_history"] if "loss" in entry]
    assert steps == list(range(1, 41))
    assert not (output_dir / LEASE_FILE).exists()
    # its logs alone: the refused run keeps none there (torchrun names a run's log directory "<app id>_...")
    held_by = re.search(r" is held by job (\S+) on host ", refusal[0])
    assert held_by is not None, refusal[0]
    kept = [path.name for path in (output_dir / "logs").iterdir()]
    assert kept and all(name.startswith(f"{held_by[1]}_") for name in kept), kept


@pytest.mark.e2e
def test_a_job_whose_client_dies_saves_a_checkpoint_stops_and_gives_the_directory_back(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    args = sft_args(output_dir, "training.max_steps=3000", "training.save_steps=100000")
    client = start_training(args, tmp_path, tmp_path / "client.log", steps=3)
    try:
        assert (output_dir / LEASE_FILE).exists()
        # its terminal closed; torchrun and the ranks are left behind
        client.send_signal(signal.SIGKILL)
        client.wait()
        deadline = time.time() + 60
        while ranks(output_dir) and time.time() < deadline:
            time.sleep(0.5)
        assert not ranks(output_dir), "the job outlived its client by a minute"
    finally:
        for pid in ranks(output_dir):
            os.kill(pid, signal.SIGKILL)
    # saved at the step's end, as at a preemption
    [checkpoint] = complete_checkpoints(output_dir)
    assert 3 <= read_json(checkpoint / "trainer_state.json")["global_step"] < 3000
    assert not (output_dir / LEASE_FILE).exists()
    # the next run into the directory is let in (it continues from the checkpoint, here with fewer steps)
    step = read_json(checkpoint / "trainer_state.json")["global_step"]
    result = torchx(sft_args(output_dir, f"training.max_steps={step + 2}", f"resume={checkpoint}"), tmp_path)
    assert_succeeded(result)
    assert read_json(output_dir / "run_summary.json")["global_steps"] == step + 2


def ranks(output_dir: Path) -> list:
    """The job's processes still running: torchrun's agent and its ranks."""
    found = subprocess.run(["pgrep", "-f", "--", f"-m .*{output_dir}"], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found]


@pytest.mark.e2e
def test_a_disk_that_fills_mid_run_ends_in_one_line_and_the_rerun_resumes_from_the_last_whole_checkpoint(
    tmp_path: Path, small_disk: Path
) -> None:
    output_dir = small_disk / "out"
    result = torchx(sft_args(output_dir), tmp_path)
    logs = assert_stopped_once(
        result, f"training.output_dir: writing into {output_dir} failed: No space left on device (0.0 MiB free); "
    )
    assert "make room (or a writable place) and run the same command again" in logs
    assert not (output_dir / LEASE_FILE).exists()
    # room made
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)
    result = torchx(sft_args(output_dir), tmp_path)
    assert_succeeded(result)
    assert f"resume: {output_dir / 'checkpoint-40'} is damaged (" in result.stderr
    summary = read_json(output_dir / "run_summary.json")
    assert summary["resumed_from"] == str(output_dir / "checkpoint-20") and summary["global_steps"] == 40


@pytest.mark.e2e
def test_a_read_only_output_dir_is_one_line_before_any_model_loads(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    subprocess.run(["mount", "--bind", "-o", "ro", str(output_dir), str(output_dir)], check=True)
    try:
        result = torchx(sft_args(output_dir), tmp_path)
    finally:
        subprocess.run(["umount", str(output_dir)], check=True)
    logs = assert_stopped_once(result, f"training.output_dir: cannot write in {output_dir}: Read-only file system")
    # stopped at its first check
    assert "training sft on" not in logs


LORA = "model.lora={r: 4, lora_alpha: 8, target_modules: all-linear}"


@pytest.mark.e2e
def test_a_finished_model_is_trained_over_only_when_told_and_then_nothing_of_it_loads_with_the_new_one(
    tmp_path: Path,
) -> None:
    output_dir = tmp_path / "out"
    # an adapter first: transformers loads a directory holding adapter_config.json as that adapter on its base
    assert_succeeded(torchx(sft_args(output_dir, "training.max_steps=4", LORA, j="1x1"), tmp_path))
    # the Trainer saves at the last step too
    assert complete_checkpoints(output_dir)
    written = {p: p.read_bytes() for p in output_dir.rglob("*") if p.is_file() and "logs" not in p.parts}
    assert output_dir / "adapter_model.safetensors" in written

    again = torchx(sft_args(output_dir, "training.max_steps=4", LORA, "resume=never", j="1x1"), tmp_path)
    # the same spec: left as it is
    assert_succeeded(again)
    assert f"{output_dir} already holds this run, finished at step 4: nothing to train" in again.stdout + again.stderr

    # every weight trained, not an adapter
    changed = ["training.max_steps=4", "resume=never"]
    result = torchx(sft_args(output_dir, *changed, j="1x1"), tmp_path)
    logs = assert_stopped_once(
        result,
        f"training.output_dir: {output_dir} holds a finished model written by a different spec (model.lora: "
        "{'lora_alpha': 8, 'r': 4, 'target_modules': 'all-linear'} -> None); use another training.output_dir, or "
        "remove its checkpoints and set overwrite_output_dir: true to train over it",
    )
    # stopped before any model loaded
    assert "training sft on" not in logs
    # the weights' bytes and everything else, unchanged
    assert {p: p.read_bytes() for p in written} == written

    # as the line says
    for checkpoint in output_dir.glob("checkpoint-*"):
        shutil.rmtree(checkpoint)
    result = torchx(sft_args(output_dir, *changed, "overwrite_output_dir=true", j="1x1"), tmp_path)
    assert_succeeded(result)
    summary = read_json(output_dir / "run_summary.json")
    assert summary["spec"]["model"]["lora"] is None and summary["global_steps"] == 4
    # the adapter's run moved aside whole, its summary with it; nothing of it left beside the new model
    [previous] = (output_dir / "previous-runs").iterdir()
    assert f"overwrite_output_dir: the model and records of the run {output_dir} held are in {previous}" in (
        result.stdout + result.stderr
    )
    assert (previous / "adapter_model.safetensors").read_bytes() == written[output_dir / "adapter_model.safetensors"]
    assert read_json(previous / "run_summary.json")["spec"]["model"]["lora"] is not None
    assert not list(output_dir.glob("adapter_*"))
    # the new model loads alone, with plain transformers (PEFT installed, as it reads adapter_config.json)
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(output_dir)
    assert not getattr(model, "_hf_peft_config_loaded", False)
    saved = load_file(output_dir / "model.safetensors")
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in saved.items())


@pytest.mark.e2e
def test_a_rendezvous_port_another_program_holds_is_one_line_at_once(tmp_path: Path) -> None:
    port = free_port()
    # not a rendezvous store: torchrun would wait on it until killed
    with socket.socket() as holder:
        holder.bind(("", port))
        holder.listen()
        started = time.monotonic()
        result = torchx(sft_args(tmp_path / "out", j="2x1", port=port), tmp_path, timeout=120)
    assert time.monotonic() - started < 60
    assert_stopped_once(result, f"--rdzv_port {port} is in use on ")
    assert not (tmp_path / "out").exists()


@pytest.mark.e2e
def test_a_job_side_stop_is_the_apps_structured_error_for_library_callers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchx.runner import get_runner
    from torchx.specs import AppState

    from posttrain.components import algorithms

    monkeypatch.chdir(REPO)
    for key, value in job_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    # a full path the client does not see: maybe on the job's machines
    missing = tmp_path / "nope.jsonl"
    app = algorithms.sft(
        f"data.train.path={missing}", f"training.output_dir={tmp_path / 'out'}", spec="templates/sft/tiny.yaml", j="1x2"
    )
    with get_runner() as runner:
        handle = runner.run(app, scheduler="local_cwd", cfg={"log_dir": str(tmp_path / "logs")})
        status = runner.wait(handle, wait_interval=1)
    assert status.state == AppState.FAILED
    message = json.loads(status.structured_error_msg)["message"]["message"]
    assert message == f"posttrain: data.train.path: no such file: {missing}"
