"""posttrain on a real Slurm (the one-host cluster ``.ci/run`` brings up with schedulers_config/slurm_up.sh).

Two slurmd emulate two nodes, so ``-j 2x1`` is a heterogeneous job with one
replica per node, rendezvousing through ``SLURM_JOB_NODELIST_HET_GROUP_0``.
"""

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import List, Tuple

import pytest

from helpers import CHAIN_PORTS, REPO, assert_succeeded, ends, free_port, read_json, torchx

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

# a job here takes 10 s (GRPO) to about 50 s (the requeued one: a failed run, then Slurm runs it again)
JOB_TIMEOUT_S = 600


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster() -> None:
    """CI starts Slurm and must run these; elsewhere they skip with how to start it."""
    ready = bool(os.environ.get("SLURM_CONF")) and subprocess.run(["sinfo"], capture_output=True).returncode == 0
    if not ready:
        message = (
            "no Slurm: NODES=2 ACCOUNTING=1 bash schedulers_config/slurm_up.sh; export SLURM_CONF=/tmp/slurm/slurm.conf"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def run_on_slurm(template: str, tmp_path: Path, output_dir: Path, args: List[str] = (), **env: str):
    algorithm = template.split("/")[0]
    try:
        result = torchx(
            [
                "run",
                "-s",
                "slurm",
                "--wait",
                "--log",
                "--workspace",
                "",
                f"posttrain.{algorithm}",
                "--spec",
                f"templates/{template}",
                "-j",
                "2x1",
                "--rdzv_port",
                str(free_port(CHAIN_PORTS if algorithm == "chain" else 1)),
                *args,
                f"output_dir={output_dir}" if algorithm == "chain" else f"training.output_dir={output_dir}",
            ],
            tmp_path,
            timeout=JOB_TIMEOUT_S,
            **env,
        )
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(hung_job_report((timeout.stdout or b"").decode()))
    assert_succeeded(result)
    handle = next(line for line in result.stdout.splitlines() if line.startswith("slurm://"))
    return result, handle


def test_sft_2x1_on_slurm_learns_and_torchx_status_and_log_work(tmp_path: Path) -> None:
    output_dir = tmp_path / "sft"
    _, handle = run_on_slurm("sft/tiny.yaml", tmp_path, output_dir)
    first, last = ends(output_dir, "loss")
    assert last <= 0.7 * first
    summary = read_json(output_dir / "run_summary.json")
    assert (summary["world_size"], summary["nnodes"]) == (2, 2)

    status = torchx(["status", handle], tmp_path)
    assert status.returncode == 0 and "SUCCEEDED" in status.stdout + status.stderr
    logs = torchx(["log", handle], tmp_path)
    assert logs.returncode == 0 and "posttrain: sft finished 40 steps in " in logs.stdout + logs.stderr
    assert f"; model in {output_dir}" in logs.stdout + logs.stderr


def test_grpo_2x1_on_slurm_raises_the_reward(tmp_path: Path) -> None:
    output_dir = tmp_path / "grpo"
    run_on_slurm("grpo/tiny.yaml", tmp_path, output_dir)
    first, last = ends(output_dir, "reward")
    assert last - first >= 0.2


def test_a_chain_2x1_on_slurm_runs_sft_then_dpo_of_the_sft_model(tmp_path: Path) -> None:
    output_dir = tmp_path / "chain"
    result, _ = run_on_slurm("chain/sft-dpo-tiny.yaml", tmp_path, output_dir)
    for stage in ("sft", "dpo"):
        summary = read_json(output_dir / stage / "run_summary.json")
        assert (summary["world_size"], summary["nnodes"]) == (2, 2), stage
    assert read_json(output_dir / "dpo" / "run_summary.json")["spec"]["model"]["name_or_path"] == str(
        output_dir / "sft"
    )
    first, last = ends(output_dir / "dpo", "rewards/margins")
    assert last > max(first, 0)
    assert "posttrain: chain finished 2 stages in " in result.stdout + result.stderr


def test_a_failed_job_is_requeued_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    output_dir = tmp_path / "requeued"
    result, _ = run_on_slurm("sft/tiny.yaml", tmp_path, output_dir, ["--max_retries", "1"], POSTTRAIN_FAULT="exit:0:25")
    logs = result.stdout + result.stderr
    assert "posttrain fault injection: exit on rank 0 at step 25" in logs
    summary = read_json(output_dir / "run_summary.json")
    assert summary["resumed_from"] == str(output_dir / "checkpoint-20") and summary["global_steps"] == 40


def test_deepspeed_launcher_with_zero2_on_slurm(tmp_path: Path) -> None:
    output_dir = tmp_path / "zero2"
    result, _ = run_on_slurm("sft/tiny-zero2.yaml", tmp_path, output_dir, ["--launcher", "deepspeed"])
    assert "-m deepspeed.launcher.runner --no_ssh --node_rank 1" in result.stdout + result.stderr
    summary = read_json(output_dir / "run_summary.json")
    assert (summary["world_size"], summary["nnodes"]) == (2, 2) and summary["engine"]["zero_stage"] == 2
    first, last = ends(output_dir, "loss")
    assert last <= 0.7 * first


def hung_job_report(client_stdout: str) -> str:
    """Where a job that outlived its test hangs; the job is cancelled, so that it holds no node for the next test.

    The report lists the job's processes (a task that never started, an
    agent or a rank stuck), and the tails of the job's logs, ``slurm-<id>-*``
    in the repository (its working directory), after every rank printed its
    stacks there (SIGUSR1, see ``distributed.setup_logging``).
    """
    found = re.search(r"slurm://torchx/(\d+)", client_stdout)
    if found is None:
        return f"torchx timed out before Slurm took the job; it printed: {client_stdout!r}"
    job_id = found.group(1)
    processes = job_processes(job_id)
    for pid, _, command in processes:
        # a rank (as torchrun and DeepSpeed start them), not a launcher
        if " -u -m posttrain.entrypoints." in command:
            os.kill(pid, signal.SIGUSR1)
    # torchrun's --tee copies the ranks' stderr into the job's log every second or so
    time.sleep(5)
    subprocess.run(["scancel", job_id], check=False)
    listing = [f"{pid} {state} {command[:160]}" for pid, state, command in processes]
    tails = [
        f"--- {log.name}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-60:])
        for log in sorted(REPO.glob(f"slurm-{job_id}*"))
    ]
    return "\n".join([f"job {job_id} still ran after {JOB_TIMEOUT_S} s (cancelled); its processes:", *listing, *tails])


def job_processes(job_id: str) -> List[Tuple[int, str, str]]:
    """(PID, state, command line) of every process of the job, all on this one-host cluster."""
    processes = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            # not a process, or gone
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in environ:
            processes.append((int(proc.name), state, command))
    return processes
