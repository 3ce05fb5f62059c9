"""reasoning-gym's tasks through the real ``torchx run``: templates/chain/reasoning-tiny.yaml (SFT on generated rows,
GRPO scored by the task's own ``score_answer``, a gate on rows of another seed), and a task the template never
names, trained and scored through the same keys. No network: the rows are generated in the job."""

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest
import reasoning_gym
import yaml

from helpers import CHAIN_PORTS, assert_succeeded, ends, free_port, load_template, read_json, torchx

pytestmark = pytest.mark.e2e


def _generated(source: Dict[str, Any]) -> Any:
    """reasoning-gym's own data set for a template's one-task ``reasoning_gym`` source, made here."""
    (task,) = source["tasks"]
    return reasoning_gym.create_dataset(task["name"], size=source["size"], seed=source["seed"], **task["config"])


@pytest.fixture(scope="module")
def reasoning_chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """templates/chain/reasoning-tiny.yaml run whole, on two processes: SFT, GRPO, and its gate."""
    tmp_path = tmp_path_factory.mktemp("reasoning-chain")
    output_dir = tmp_path / "reasoning"
    args = ["run", "-s", "local_cwd", "posttrain.chain", "--spec", "templates/chain/reasoning-tiny.yaml"]
    args += ["-j", "1x2", "--rdzv_port", str(free_port(CHAIN_PORTS)), f"output_dir={output_dir}"]
    assert_succeeded(torchx(args, tmp_path, timeout=900))
    return output_dir


def test_the_reasoning_chain_orders_base_sft_grpo_on_held_out_seeds_as_the_task_scores_them(
    reasoning_chain: Path,
) -> None:
    output_dir = reasoning_chain
    first, last = ends(output_dir / "grpo", "rewards/reasoning_gym/mean")
    assert last - first >= 0.15, (first, last)

    check = read_json(output_dir / "check" / "eval_summary.json")
    assert [verdict["held"] for verdict in check["require"]] == [True, True], check["require"]
    means = {model: check["models"][model]["reasoning_gym"]["mean"] for model in ("base", "sft", "grpo")}
    assert means["base"] < means["sft"] < means["grpo"], means

    # every sample's score is the task's own score_answer of what its tags held, on the row the seed gives, which
    # two processes asked as reasoning-gym writes it
    held_out = _generated(load_template("eval/reasoning-tiny.yaml")["data"]["eval"]["reasoning_gym"])
    samples = [json.loads(line) for line in (output_dir / "check" / "eval_samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * 64 * 4
    for sample in samples:
        entry = held_out[sample["index"]]
        assert sample["prompt"][-1]["content"] == entry["question"]
        answer = sample["extra"]["reasoning_gym/answer"] or None
        assert sample["scores"]["reasoning_gym"] == held_out.score_answer(answer, entry=entry), sample


def test_a_task_the_template_never_names_trains_and_scores_through_the_same_keys(
    reasoning_chain: Path, tmp_path: Path
) -> None:
    """GRPO's template with another of reasoning-gym's tasks, chain_sum, from the chain's SFT model (which answers
    in the tags): its rows and its score_answer come through the same keys, each sample scored as the task scores
    it by hand."""
    source = {
        "tasks": [
            {
                "name": "chain_sum",
                "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "allow_negation": False},
            }
        ],
        "size": 256,
        "seed": 7,
        "system": "Answer in <answer></answer> tags.",
    }
    spec = load_template("grpo/tiny-reasoning.yaml")
    spec["model"]["name_or_path"] = str(reasoning_chain / "sft")
    spec["data"]["train"]["reasoning_gym"] = source
    output_dir = tmp_path / "chain-sum"
    spec["training"].update(max_steps=6, save_steps=6, output_dir=str(output_dir))
    written = tmp_path / "chain-sum.yaml"
    written.write_text(yaml.safe_dump(spec))
    args = ["run", "-s", "local_cwd", "posttrain.grpo", "--spec", str(written), "-j", "1x2"]
    assert_succeeded(torchx([*args, "--rdzv_port", str(free_port())], tmp_path))

    generated = _generated(source)
    rows = {entry["question"]: entry for entry in generated}
    samples: List[dict] = [json.loads(line) for line in (output_dir / "samples.jsonl").read_text().splitlines()]
    assert {sample["step"] for sample in samples} == set(range(1, 7))
    scores = []
    for sample in samples:
        entry = rows[sample["prompt"][-1]["content"]]
        answer = sample["extra"]["reasoning_gym/answer"] or None
        assert sample["rewards"]["reasoning_gym"] == generated.score_answer(answer, entry=entry), sample
        scores.append(sample["rewards"]["reasoning_gym"])
    # answers in the tags, some right: the scores are the task's, not a missing answer's zeros
    assert any(sample["extra"]["reasoning_gym/answer"] for sample in samples) and max(scores) == 1.0
