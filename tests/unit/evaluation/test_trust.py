"""What a gate trusts (evaluation/trust.py): a summary sealed with its samples, and what decides a scorer's scores."""

import json
from pathlib import Path

import pytest

from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.sections import RewardSource
from posttrain.entrypoints.evaluation import scoring, trust


def written(output_dir: Path) -> dict:
    (output_dir / "eval_samples.jsonl").write_text('{"model": "base", "index": 0, "completion": "Madrid."}\n')
    summary = trust.sealed(
        {"models": {"base": {"contains": {"mean": 0.5, "samples": 16}}}}, output_dir / "eval_samples.jsonl"
    )
    summary["require"] = [{"condition": "base.contains >= 0.5", "held": True}]
    (output_dir / "eval_summary.json").write_text(json.dumps(summary))
    return json.loads((output_dir / "eval_summary.json").read_text())


def test_a_summary_as_written_is_trusted_and_its_conditions_may_be_judged_again(tmp_path: Path) -> None:
    summary = written(tmp_path)
    trust.check_sealed(summary, tmp_path)
    summary["require"] = []
    trust.check_sealed(summary, tmp_path)


def test_a_summary_edited_by_hand_is_refused_in_one_line(tmp_path: Path) -> None:
    summary = written(tmp_path)
    summary["models"]["base"]["contains"]["mean"] = 0.9
    with pytest.raises(SpecError) as error:
        trust.check_sealed(summary, tmp_path)
    [line] = error.value.problems
    assert "eval_summary.json is not as the evaluation wrote it" in line


@pytest.mark.parametrize("change", ["edited", "removed"])
def test_samples_edited_or_removed_are_refused_in_one_line(tmp_path: Path, change: str) -> None:
    summary = written(tmp_path)
    samples = tmp_path / "eval_samples.jsonl"
    if change == "edited":
        samples.write_text(samples.read_text().replace("Madrid.", "Madrid"))
    else:
        samples.unlink()
    with pytest.raises(SpecError) as error:
        trust.check_sealed(summary, tmp_path)
    [line] = error.value.problems
    assert "eval_samples.jsonl is not the file eval_summary.json was computed from" in line


def test_a_scorer_is_known_by_its_code_and_a_reward_model_by_its_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "judge_module.py"
    module.write_text("def judge(completions, **kwargs):\n    return [1.0 for _ in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    model = tmp_path / "reward-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    rewards = [
        RewardSource(builtin="contains", args={"column": "answer"}),
        RewardSource(function="judge_module:judge"),
        RewardSource(model=str(model)),
    ]
    before = trust.scorer_fingerprints(rewards)
    assert trust.scorer_fingerprints(rewards) == before
    module.write_text(module.read_text().replace("1.0", "0.0"))
    (model / "model.safetensors").write_bytes(b"other weights")
    after = trust.scorer_fingerprints(rewards)
    assert after["0"] == before["0"]
    assert after["1"] != before["1"] and after["2"] != before["2"]


def test_a_summary_written_before_seals_is_named_so(tmp_path: Path) -> None:
    summary = written(tmp_path)
    del summary["seal"]
    with pytest.raises(SpecError) as error:
        trust.check_sealed(summary, tmp_path)
    assert "has no seal (written before posttrain sealed its results, or by another tool)" in error.value.problems[0]


def test_an_environments_get_reward_scores_its_own_episodes_and_is_awaited_where_async() -> None:
    class Room:
        async def get_reward(self) -> float:
            return 1.0

    class Lamp:
        def get_reward(self) -> float:
            return 0.5

    scorer = scoring.environment_scorer("room")
    assert scorer(environments=[Room(), Lamp()], environment=["room", "lamp"]) == [1.0, None]
    assert scoring.environment_scorer(None)(environments=[Lamp()]) == [0.5]
