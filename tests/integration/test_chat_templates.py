"""A reward model without a chat template: TRL raised at the first step, after generating; the job says it in one
line before any model loads."""

from pathlib import Path

import pytest
import transformers

from helpers import load_template, run_refused, tiny_job, trainer_with
from posttrain.entrypoints.inputs import tiny

pytestmark = pytest.mark.usefixtures("job_process")


def test_a_reward_model_without_a_chat_template_is_one_line_before_any_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    tokenizer = tiny.build_tokenizer_llama3()
    # a reward model trained from a base model on text rows
    tokenizer.chat_template = None
    reward_dir = tmp_path / "reward-model"
    tiny.build_model_llama3(tokenizer, transformers.LlamaForSequenceClassification).save_pretrained(reward_dir)
    tokenizer.save_pretrained(reward_dir)
    rewards = [{"model": str(reward_dir)}]
    # what TRL did: it raised at the first step, after generating, the models loaded
    trainer = trainer_with(tiny_job(tmp_path, "grpo", rewards=rewards), max_steps=1)
    with pytest.raises(ValueError, match="Cannot use chat template functions"):
        trainer.train()
    # chat prompts
    raw = load_template("grpo/tiny.yaml")
    raw["rewards"] = rewards
    raw["training"]["output_dir"] = str(tmp_path / "out")
    err = run_refused(raw, monkeypatch, capsys)
    assert (
        err.count(
            f"posttrain: rewards.0: data.train's rows are chat messages, which the reward model {reward_dir} "
            "scores rendered with its tokenizer's chat template, and it has none"
        )
        == 1
    ), err
