"""posttrain.chain through the real ``torchx run``: the tiny RLHF chain in one job, killed and picked up again."""

import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import CHAIN_PORTS, REPO, assert_succeeded, assert_valid_png, ends, free_port, job_env, read_json, torchx

pytestmark = pytest.mark.e2e


def kill_when(marker: Path, output_dir: Path, log_path: Path, args: list, tmp_path: Path, **env: str) -> None:
    """Runs ``torchx ARGS`` until ``marker`` exists, then SIGKILLs every process of the job (each names
    output_dir)."""
    with log_path.open("w") as log:
        client = subprocess.Popen(
            [str(Path(sys.executable).parent / "torchx"), *args],
            cwd=REPO,
            env=job_env(tmp_path, **env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.time() + 600
    while not marker.exists() and client.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    assert marker.exists() and client.poll() is None, log_path.read_text()[-3000:]
    subprocess.run(["pkill", "-KILL", "-f", str(output_dir)], check=False)
    client.kill()
    client.wait(timeout=30)


def test_the_rlhf_chain_picks_up_after_a_kill_and_ppo_raises_the_reward_model_s_scores(tmp_path: Path) -> None:
    output_dir = tmp_path / "rlhf"
    args = ["run", "-s", "local_cwd", "posttrain.chain", "--spec", "templates/chain/rlhf-tiny.yaml", "-j", "1x2"]
    args += ["--rdzv_port", str(free_port(CHAIN_PORTS)), f"output_dir={output_dir}"]
    # the reward stage's rank 0 stops at step 22, its checkpoint-20 whole; then every process is killed
    hanging = output_dir / "reward" / ".posttrain_fault_hang_0_22"
    kill_when(hanging, output_dir, tmp_path / "killed.log", args, tmp_path, POSTTRAIN_FAULT="hang:0:22@reward")
    assert not (output_dir / "reward" / "run_summary.json").exists()
    sft_files = {path: path.stat().st_mtime_ns for path in (output_dir / "sft").rglob("*") if path.is_file()}
    # the gate ran too (and is judged again at every run)
    assert read_json(output_dir / "chain.json")["stages"].keys() == {"sft", "check"}

    # the same command
    again = torchx(args, tmp_path, timeout=900)
    assert_succeeded(again)
    logs = again.stdout + again.stderr
    assert f"chain: stage sft finished already ({output_dir}/sft)" in logs and "training sft on" not in logs
    # the chain's closing line; each stage's own is a chain: line
    assert logs.count("posttrain: ") == 1
    # not one file of SFT's touched
    assert {path: path.stat().st_mtime_ns for path in sft_files} == sft_files
    assert read_json(output_dir / "reward" / "run_summary.json")["resumed_from"] == str(
        output_dir / "reward" / "checkpoint-20"
    )
    # the reward model's scores of PPO's samples
    first, last = ends(output_dir / "ppo", "objective/scores")
    assert last - first > 0.2
    ppo_spec = read_json(output_dir / "ppo" / "run_summary.json")["spec"]
    assert ppo_spec["model"]["name_or_path"] == str(output_dir / "sft")
    assert ppo_spec["rewards"][0]["model"] == str(output_dir / "reward")

    summary = read_json(output_dir / "run_summary.json")
    assert [(stage["name"], stage["status"]) for stage in summary["stages"]] == [
        ("sft", "finished"),
        ("check", "finished"),
        ("reward", "finished"),
        ("ppo", "finished"),
    ]
    assert summary["stages"][3]["metrics_last"]["objective/scores"] == pytest.approx(last)
    # the gate judged the SFT model again on its finished results, and it held
    assert f"chain: stage check: {output_dir}/check holds this evaluation, finished: eval of 2 models" in logs
    [gate] = summary["stages"][1]["require"]
    assert gate["condition"] == "sft.regex_format - base.regex_format >= 0.3" and gate["held"]
    assert set(assert_valid_png(output_dir / "curves.png")["runs"]) == {"sft", "reward", "ppo"}
    closing = [line for line in logs.splitlines() if "posttrain: chain finished 4 stages in " in line]
    assert closing and closing[0].endswith(
        f"sft -> {output_dir}/sft, check -> {output_dir}/check, reward -> {output_dir}/reward, ppo -> {output_dir}/ppo"
    )


def test_a_gate_that_does_not_hold_stops_the_chain_before_the_next_stage_and_a_rerun_judges_again(
    tmp_path: Path,
) -> None:
    """An evaluation stage comparing the tiny model with itself: the template's require (+0.3) fails, in one line,
    and DPO never starts; the same chain with a condition that holds judges the same results again and goes on."""
    spec = tmp_path / "gate.yaml"
    spec.write_text(
        f"""algorithm: chain
output_dir: {tmp_path / "gate"}
stages:
  check:
    spec: {REPO / "templates/eval/sft-tiny.yaml"}
    models: {{sft: {{name_or_path: "builtin:tiny-llama"}}}}
  dpo:
    spec: {REPO / "templates/dpo/tiny.yaml"}
    training: {{max_steps: 4, save_steps: 4, logging_steps: 1}}
"""
    )
    args = ["run", "-s", "local_cwd", "posttrain.chain", "--spec", str(spec), "-j", "1x2"]
    args += ["--rdzv_port", str(free_port(CHAIN_PORTS))]
    stopped = torchx(args, tmp_path, timeout=900)
    logs = stopped.stdout + stopped.stderr
    assert stopped.returncode == 1, logs[-3000:]
    # the base model against itself: the same samples, a difference of exactly 0
    line = r"^chain/0 \[0\]:posttrain: require: sft.regex_format - base.regex_format >= 0.3 does not hold: "
    line += r"sft.regex_format ([\d.e-]+), base.regex_format \1; difference 0$"
    assert len(re.findall(line, logs, re.M)) == 1, logs[-3000:]
    assert "chain: stage dpo" not in logs and not (tmp_path / "gate" / "dpo").exists()
    summary = read_json(tmp_path / "gate" / "run_summary.json")
    assert [(stage["name"], stage["status"]) for stage in summary["stages"]] == [
        ("check", "failed"),
        ("dpo", "not run"),
    ]
    assert summary["stages"][0]["require"][0]["held"] is False

    # a condition that holds: judged on the same results (nothing sampled again), and DPO runs
    held = torchx([*args, "stages.check.require=[sft.regex_format - base.regex_format >= 0]"], tmp_path, timeout=900)
    assert_succeeded(held)
    logs = held.stdout + held.stderr
    assert "holds this evaluation, finished" in logs and "posttrain: chain finished 2 stages in " in logs
    assert read_json(tmp_path / "gate" / "dpo" / "run_summary.json")["global_steps"] == 4
    # the conditions it was judged on this time
    [gate] = read_json(tmp_path / "gate" / "run_summary.json")["stages"][0]["require"]
    assert (gate["condition"], gate["held"]) == ("sft.regex_format - base.regex_format >= 0", True)


def edit_in_place(path: Path, offset: int) -> None:
    """One bit of ``path`` flipped where it lies (a letter's case, a weight's last bit), its size and modification
    time kept (``touch -r``)."""
    stat = path.stat()
    with path.open("r+b") as stream:
        stream.seek(offset)
        byte = stream.read(1)
        stream.seek(offset)
        stream.write(bytes([byte[0] ^ 0x20 if byte.isalpha() else byte[0] ^ 1]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_stage_whose_model_or_data_changed_in_place_trains_again_with_the_stages_after_it(tmp_path: Path) -> None:
    output_dir = tmp_path / "sft-dpo"
    rows = tmp_path / "sft_chat.jsonl"
    shutil.copy(REPO / "templates/data/sft_chat.jsonl", rows)
    args = ["run", "-s", "local_cwd", "posttrain.chain", "--spec", "templates/chain/sft-dpo-tiny.yaml", "-j", "1x1"]
    args += [
        "--rdzv_port",
        str(free_port(CHAIN_PORTS)),
        f"output_dir={output_dir}",
        f"stages.sft.data.train.path={rows}",
    ]
    # what is trained from what, not how well: a few steps each
    args += ["stages.sft.training.max_steps=10", "stages.dpo.training.max_steps=4", "stages.dpo.training.save_steps=4"]
    assert_succeeded(torchx(args, tmp_path, timeout=900))
    first_sft = read_json(output_dir / "sft" / "run_summary.json")
    dpo = read_json(output_dir / "dpo" / "run_summary.json")
    assert set(dpo["inputs"]["models"]["model.name_or_path"]["files"]) >= {"model.safetensors", "config.json"}

    # SFT's model edited in place after its run (a weight deep in the file): DPO alone trains again, from scratch
    weights = output_dir / "sft" / "model.safetensors"
    start = 8 + struct.unpack("<Q", weights.read_bytes()[:8])[0]
    # the lowest byte of a float32 weight halfway through the data: a change in its last bits
    edit_in_place(weights, start + (weights.stat().st_size - start) // 8 * 4)
    again = torchx(args, tmp_path, timeout=900)
    assert_succeeded(again)
    logs = again.stdout + again.stderr
    assert "chain: stage sft finished already" in logs
    assert (
        f"chain: stage dpo: model.name_or_path ({output_dir}/sft) is not the model it was trained from; "
        "training it again (its run from the old inputs removed)"
    ) in logs
    assert "nothing to train" not in logs
    dpo_again = read_json(output_dir / "dpo" / "run_summary.json")
    assert dpo_again["run_id"] != dpo["run_id"] and dpo_again["global_steps"] == dpo["global_steps"]
    # no checkpoint of the old model's run resumed
    assert dpo_again["resumed_from"] is None

    # SFT's data edited in place (a letter of an answer): SFT trains again, and DPO after it
    edit_in_place(rows, rows.read_bytes().index(b'"content": "') + len('"content": "'))
    edited = torchx(args, tmp_path, timeout=900)
    assert_succeeded(edited)
    logs = edited.stdout + edited.stderr
    assert f"chain: stage sft: data.train ({rows}) changed since it was saved; training it again" in logs
    sft = read_json(output_dir / "sft" / "run_summary.json")
    assert sft["run_id"] != first_sft["run_id"] and sft["resumed_from"] is None
    assert read_json(output_dir / "dpo" / "run_summary.json")["run_id"] != dpo_again["run_id"]

    # nothing changed since: both stages finished already, neither trains
    last = torchx(args, tmp_path, timeout=900)
    assert_succeeded(last)
    logs = last.stdout + last.stderr
    assert "chain: stage sft finished already" in logs and "chain: stage dpo finished already" in logs
