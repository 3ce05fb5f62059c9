"""Sharding through ``torchx run -s local_cwd``: what ran is what the spec asked for.

DeepSpeed ZeRO runs on CPU here. accelerate runs FSDP on GPUs only, so on
CPU the FSDP job must stop before training; the FSDP training test needs
GPUs (``pytest -m gpu`` on a GPU machine).
"""

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import REPO, assert_stopped_once, assert_succeeded, ends, job_env, read_json, run_template, series

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def plain_losses(sft_1x2: Path) -> list:
    return series(sft_1x2, "loss")


OFFLOAD = ["distributed.deepspeed.offload_optimizer=true", "distributed.deepspeed.offload_params=true"]


@pytest.mark.parametrize(
    "template, stage, overrides",
    # ZeRO-3 without offload: the restart test below, whose first 20 steps are its first attempt's
    [("sft/tiny-zero2.yaml", 2, []), ("sft/tiny-zero3.yaml", 3, OFFLOAD)],
    ids=["zero2", "zero3-offload"],
)
def test_sft_with_zero_learns_like_ddp_and_reports_deepspeed(
    tmp_path: Path, plain_losses: list, template: str, stage: int, overrides: list
) -> None:
    output_dir = tmp_path / "out"
    assert_succeeded(run_template(template, tmp_path, output_dir, overrides=overrides))
    summary = read_json(output_dir / "run_summary.json")
    assert summary["engine"] == {"backend": "gloo", "strategy": "deepspeed", "zero_stage": stage}
    first, last = ends(output_dir, "loss")
    assert last <= 0.7 * first
    # same seed, data and settings: the first steps match plain DDP
    assert series(output_dir, "loss")[:3] == pytest.approx(plain_losses[:3], rel=0.05)
    checkpoint = output_dir / "checkpoint-20"
    assert any(p.name.startswith("global_step") for p in checkpoint.iterdir()), "DeepSpeed's checkpoint layout"
    AutoModelForCausalLM.from_pretrained(output_dir)
    assert json.loads((output_dir / "config.json").read_text())["num_hidden_layers"] == 2


def test_zero3_learns_like_ddp_and_a_restart_resumes_from_its_own_checkpoint(
    tmp_path: Path, plain_losses: list
) -> None:
    output_dir = tmp_path / "out"
    restart_after_crash = {"extra_args": ["--max_restarts", "1"], "POSTTRAIN_FAULT": "exit:1:25"}
    assert_succeeded(run_template("sft/tiny-zero3.yaml", tmp_path, output_dir, **restart_after_crash))
    summary = read_json(output_dir / "run_summary.json")
    assert summary["resumed_from"] == str(output_dir / "checkpoint-20") and summary["global_steps"] == 40
    assert summary["engine"] == {"backend": "gloo", "strategy": "deepspeed", "zero_stage": 3}
    # DeepSpeed's checkpoint layout, and a model that loads
    assert (output_dir / "checkpoint-20" / "global_step20").is_dir()
    AutoModelForCausalLM.from_pretrained(output_dir)
    assert json.loads((output_dir / "config.json").read_text())["num_hidden_layers"] == 2
    losses = series(output_dir, "loss")
    first, last = ends(output_dir, "loss")
    assert last <= 0.7 * first
    # the first attempt's first steps match plain DDP (same seed, data and settings); optimizer, scheduler and data
    # position came back: steps 21-40 are those of the uninterrupted run
    assert losses[:3] == pytest.approx(plain_losses[:3], rel=0.05)
    assert losses[20:] == pytest.approx(plain_losses[20:40], rel=1e-3)


ZERO3 = "distributed.deepspeed={zero_stage: 3}"


def test_dpo_with_zero3_from_a_model_path_learns(tmp_path: Path, sft_1x2: Path) -> None:
    output_dir = tmp_path / "dpo"
    overrides = [f"model.name_or_path={sft_1x2}", ZERO3]
    assert_succeeded(run_template("dpo/tiny.yaml", tmp_path, output_dir, overrides=overrides))
    assert read_json(output_dir / "run_summary.json")["engine"]["zero_stage"] == 3
    margin_first, margin_last = ends(output_dir, "rewards/margins")
    _, accuracy = ends(output_dir, "rewards/accuracies")
    assert accuracy >= 0.75 and margin_last > max(margin_first, 0)


def test_grpo_with_zero3_from_a_model_path_raises_the_reward(tmp_path: Path, sft_1x2: Path) -> None:
    output_dir = tmp_path / "grpo"
    overrides = [f"model.name_or_path={sft_1x2}", ZERO3]
    assert_succeeded(run_template("grpo/tiny.yaml", tmp_path, output_dir, overrides=overrides))
    assert read_json(output_dir / "run_summary.json")["engine"]["zero_stage"] == 3
    first, last = ends(output_dir, "reward")
    assert last - first >= 0.2


DEEPSPEED_LAUNCHER = ["--launcher", "deepspeed"]


def test_deepspeed_launcher_trains_on_two_nodes(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    result = run_template("sft/tiny-zero2.yaml", tmp_path, output_dir, j="2x1", extra_args=DEEPSPEED_LAUNCHER)
    assert_succeeded(result)
    logs = result.stdout + result.stderr
    for node in (0, 1):
        assert f"-m deepspeed.launcher.runner --no_ssh --node_rank {node} --master_addr localhost" in logs
    summary = read_json(output_dir / "run_summary.json")
    assert (summary["world_size"], summary["nnodes"]) == (2, 2)
    assert summary["engine"] == {"backend": "gloo", "strategy": "deepspeed", "zero_stage": 2}
    first, last = ends(output_dir, "loss")
    assert last <= 0.7 * first


def test_deepspeed_launcher_fails_the_job_when_a_rank_crashes(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    result = run_template(
        "sft/tiny.yaml", tmp_path, output_dir, j="2x1", extra_args=DEEPSPEED_LAUNCHER, POSTTRAIN_FAULT="exit:1:5"
    )
    assert result.returncode != 0 and "Job finished: FAILED" in result.stderr
    assert not (output_dir / "run_summary.json").exists()


def test_deepspeed_launcher_fails_the_job_when_deepspeeds_launch_process_is_killed(tmp_path: Path) -> None:
    """DeepSpeed's runner itself exits 0 then, leaving the ranks running."""
    output_dir = tmp_path / "out"
    command = [
        "torchx",
        "run",
        "-s",
        "local_cwd",
        "posttrain.sft",
        "--spec",
        "templates/sft/tiny.yaml",
        *DEEPSPEED_LAUNCHER,
        "training.output_dir=" + str(output_dir),
    ]
    # rank 0 stops at step 3, so the kill lands mid-run
    env = job_env(tmp_path, POSTTRAIN_FAULT="hang:0:3")
    job = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marker, deadline = output_dir / ".posttrain_fault_hang_0_3", time.monotonic() + 300
    while not marker.exists() and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.5)
    assert marker.exists(), "the run never reached step 3"
    subprocess.run(["pkill", "-KILL", "-f", f"deepspeed.launcher.launch .*{output_dir}"], check=True)
    logs, _ = job.communicate(timeout=120)
    assert job.returncode != 0 and "Job finished: FAILED" in logs
    assert "DeepSpeed's launcher exited 0, but rank(s) 0, 1 never reported finishing" in logs
    leftovers = subprocess.run(["pgrep", "-f", str(output_dir)], capture_output=True, text=True).stdout
    assert not leftovers, "the node's ranks must not outlive the job"


def test_fsdp_on_cpu_stops_before_training_instead_of_running_ddp(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    result = run_template("sft/tiny-fsdp.yaml", tmp_path, output_dir)
    logs = assert_stopped_once(result, "distributed.fsdp: this job sees no GPU, and accelerate runs FSDP on GPUs only")
    assert "training sft on" not in logs and not (output_dir / "run_summary.json").exists()


@pytest.mark.gpu
def test_sft_with_fsdp2_on_gpus_learns_like_ddp_resumes_and_saves_a_plain_model(tmp_path: Path) -> None:
    gpus = torch.cuda.device_count()
    assert gpus >= 1, "run with pytest -m gpu on a machine with GPUs"
    j, gpu_args = f"1x{gpus}", ["--gpu", str(gpus)]
    ddp_dir, fsdp_dir = tmp_path / "ddp", tmp_path / "fsdp"
    assert_succeeded(run_template("sft/tiny.yaml", tmp_path, ddp_dir, j=j, extra_args=gpu_args))
    offload = ["distributed.fsdp.cpu_offload=true"]
    # and a restart resumes from the sharded checkpoint-20
    crash = {"POSTTRAIN_FAULT": f"exit:{gpus - 1}:25"}
    restarts = [*gpu_args, "--max_restarts", "1"]
    assert_succeeded(
        run_template("sft/tiny-fsdp.yaml", tmp_path, fsdp_dir, j=j, extra_args=restarts, overrides=offload, **crash)
    )
    summary = read_json(fsdp_dir / "run_summary.json")
    assert summary["engine"]["strategy"] == "fsdp" and "nccl" in summary["engine"]["backend"]
    assert summary["resumed_from"] == str(fsdp_dir / "checkpoint-20") and summary["global_steps"] == 40
    first, last = ends(fsdp_dir, "loss")
    assert last <= 0.7 * first
    assert series(fsdp_dir, "loss")[:3] == pytest.approx(series(ddp_dir, "loss")[:3], rel=0.05)
    assert any(p.name.startswith("pytorch_model_fsdp") for p in (fsdp_dir / "checkpoint-20").iterdir()), "sharded"
    AutoModelForCausalLM.from_pretrained(fsdp_dir)
