"""GRPO, GSPO, RLOO, online DPO and PPO end to end through ``torchx run -s local_cwd``: the reward rises."""

import shutil
import textwrap
from pathlib import Path

import pytest
from helpers import assert_succeeded, ends, read_json, run_template, series
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

pytestmark = pytest.mark.e2e


def reward_rise(output_dir: Path, key: str) -> float:
    first, last = ends(output_dir, key)
    return last - first


@pytest.fixture(scope="module")
def ppo_run(session_tmp: Path) -> Path:
    output_dir = session_tmp / "ppo"
    assert_succeeded(run_template("ppo/tiny.yaml", session_tmp, output_dir))
    return output_dir


@pytest.mark.parametrize("template", ["grpo/tiny.yaml", "grpo/gspo-tiny.yaml", "rloo/tiny.yaml"])
def test_group_methods_raise_the_reward(tmp_path: Path, template: str) -> None:
    output_dir = tmp_path / "out"
    assert_succeeded(run_template(template, tmp_path, output_dir))
    assert reward_rise(output_dir, "reward") >= 0.2


def test_online_dpo_raises_the_score_of_its_sampled_answers(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    assert_succeeded(run_template("online_dpo/tiny.yaml", tmp_path, output_dir))
    assert reward_rise(output_dir, "objective/scores") >= 0.2
    assert read_json(output_dir / "run_summary.json")["algorithm"] == "online_dpo"
    assert AutoModelForCausalLM.from_pretrained(output_dir) is not None


def test_grpo_2x1_multinode_rendezvous_raises_the_reward(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    assert_succeeded(run_template("grpo/tiny.yaml", tmp_path, output_dir, j="2x1"))
    assert reward_rise(output_dir, "reward") >= 0.2
    summary = read_json(output_dir / "run_summary.json")
    assert (summary["world_size"], summary["nnodes"]) == (2, 2)


def test_ppo_raises_the_reward_and_saves_policy_and_value_model(ppo_run: Path) -> None:
    assert reward_rise(ppo_run, "objective/scores") >= 0.2
    entry = series(ppo_run, "objective/kl")
    assert entry[0] == pytest.approx(0.0, abs=1e-4), "logprobs must use the sampling temperature"
    for key in ("loss/policy", "loss/value", "policy/clipfrac", "objective/entropy"):
        assert len(series(ppo_run, key)) == 30, key
    summary = read_json(ppo_run / "run_summary.json")
    assert summary["algorithm"] == "ppo" and summary["global_steps"] == 30
    assert summary["engine"] == {"backend": "gloo", "strategy": "ddp", "zero_stage": None}
    assert summary["train_tokens"] > 0
    AutoModelForCausalLM.from_pretrained(ppo_run)
    AutoModelForSequenceClassification.from_pretrained(ppo_run / "value_model")


def test_ppo_resumes_from_its_checkpoint(ppo_run: Path, session_tmp: Path) -> None:
    output_dir = session_tmp / "ppo-resumed"
    output_dir.mkdir()
    shutil.copytree(ppo_run / "checkpoint-20", output_dir / "checkpoint-20")
    shutil.copy(ppo_run / "posttrain_spec.json", output_dir)
    assert_succeeded(run_template("ppo/tiny.yaml", session_tmp, output_dir))
    summary = read_json(output_dir / "run_summary.json")
    assert summary["resumed_from"] == str(output_dir / "checkpoint-20") and summary["global_steps"] == 30
    assert [e["step"] for e in read_json(output_dir / "trainer_state.json")["log_history"] if "loss" in e] == list(
        range(1, 31)
    )
    # the same prompts and sampling streams: the resumed steps repeat the original run's rollouts
    assert series(output_dir, "objective/scores")[20] == pytest.approx(series(ppo_run, "objective/scores")[20])


def test_rlhf_chain_sft_then_reward_model_then_ppo(sft_1x2: Path, reward_model: Path, session_tmp: Path) -> None:
    output_dir = session_tmp / "ppo-rlhf"
    result = run_template(
        "ppo/rlhf-tiny.yaml", session_tmp, output_dir,
        overrides=[f"model.name_or_path={sft_1x2}", f"rewards.0.model={reward_model}"],
    )  # fmt: skip
    assert_succeeded(result)
    assert reward_rise(output_dir, "objective/scores") > 0.2
    assert read_json(output_dir / "run_summary.json")["spec"]["rewards"][0]["model"] == str(reward_model)


def test_user_reward_function_from_the_workspace(tmp_path: Path) -> None:
    module_dir = tmp_path / "user_code"
    module_dir.mkdir()
    (module_dir / "my_rewards.py").write_text(textwrap.dedent('''
        def says_blue(completions, **columns):
            return [float("blue" in c[0]["content"].lower()) for c in completions]
    '''))
    output_dir = tmp_path / "out"
    result = run_template(
        "grpo/tiny.yaml", tmp_path, output_dir, overrides=["rewards=[{function: 'my_rewards:says_blue'}]"],
        PYTHONPATH=str(module_dir),
    )  # fmt: skip
    assert_succeeded(result)
    assert reward_rise(output_dir, "reward") >= 0.2
    assert series(output_dir, "rewards/says_blue/mean")


def test_unimportable_user_code_stops_the_job_before_the_model_loads(tmp_path: Path) -> None:
    result = run_template("grpo/tiny.yaml", tmp_path, tmp_path / "out", overrides=["rewards=[{function: 'nowhere:score'}]"])
    assert result.returncode != 0
    logs = result.stdout + result.stderr
    assert "rewards.0.function: cannot import nowhere:score" in logs and "No module named 'nowhere'" in logs
    assert "training grpo on" not in logs
