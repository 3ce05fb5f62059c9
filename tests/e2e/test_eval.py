"""posttrain.eval through the real ``torchx run``: the tiny model before and after its tiny SFT on held-out
questions, its ``require:`` gate holding and failing, the same samples on one process as on two, and a rerun that
samples only the prompts left; the same evaluation at the end of a training job (an ``evaluate:`` section); and a
benchmark of lm-evaluation-harness defined from a local file; a reward model as a scorer."""

import collections
import json
import re
import subprocess
from pathlib import Path
from typing import List

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from helpers import (
    REPO,
    assert_stopped_once,
    assert_succeeded,
    assert_valid_png,
    free_port,
    read_json,
    run_template,
    torchx,
)

pytestmark = pytest.mark.e2e

PROMPTS, SAMPLES = 60, 4


def eval_args(output_dir: Path, sft: Path, j: str) -> List[str]:
    args = ["run", "-s", "local_cwd", "posttrain.eval", "--spec", "templates/eval/sft-tiny.yaml", "-j", j]
    return args + ["--rdzv_port", str(free_port()), f"output_dir={output_dir}", f"models.sft.name_or_path={sft}"]


def run_eval(tmp_path: Path, output_dir: Path, sft: Path, j: str) -> str:
    result = torchx(eval_args(output_dir, sft, j), tmp_path)
    assert_succeeded(result)
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def two(sft_1x2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The template's evaluation of the session's tiny SFT model, on two processes; its console in ``said.txt``."""
    tmp_path = tmp_path_factory.mktemp("eval")
    output_dir = tmp_path / "two"
    said = run_eval(tmp_path, output_dir, sft_1x2, "1x2")
    (tmp_path / "said.txt").write_text(said)
    return output_dir


def samples_of(output_dir: Path, model: str) -> List[str]:
    """A model's completions in ``eval_samples.jsonl``, prompt after prompt."""
    samples = [json.loads(line) for line in (output_dir / "eval_samples.jsonl").read_text().splitlines()]
    return [sample["completion"] for sample in samples if sample["model"] == model]


def test_the_sft_model_is_ahead_on_any_number_of_processes_and_a_rerun_goes_on(
    two: Path, sft_1x2: Path, tmp_path: Path
) -> None:
    said = (two.parent / "said.txt").read_text()
    summary = read_json(two / "eval_summary.json")
    # the SFT data's answers end with a full stop: the trained model's do, far beyond the error
    ahead = summary["comparisons"]["sft"]["regex_format"]
    assert ahead["mean"] > 0.3 and ahead["mean"] > 4 * ahead["stderr"], ahead
    assert (
        summary["models"]["base"]["regex_format"]["pass_at_k"]["4"]
        <= summary["models"]["sft"]["regex_format"]["pass_at_k"]["4"]
    )
    assert (summary["prompts"], summary["num_samples"]) == (PROMPTS, SAMPLES)
    assert summary["generation"]["engine"] == "transformers" and summary["generation"]["processes"] == 2
    line = re.search(r"posttrain: eval of 2 models \(base, sft\) on 60 prompts: contains .*; regex_format .*", said)
    assert line is not None and line.group(0) == summary["closing_line"], said[-2000:]
    samples = (two / "eval_samples.jsonl").read_text().splitlines()
    assert len(samples) == 2 * PROMPTS * SAMPLES
    assert assert_valid_png(two / "eval.png") == {model: summary["models"][model] for model in ("base", "sft")}
    assert not (two / "eval_parts").exists()
    # the template's gate: the SFT model ends its answers with a full stop 0.3 more often than the base
    [verdict] = summary["require"]
    means = {model: summary["models"][model]["regex_format"]["mean"] for model in ("sft", "base")}
    assert verdict["condition"] == "sft.regex_format - base.regex_format >= 0.3" and verdict["held"]
    assert verdict["value"] == pytest.approx(means["sft"] - means["base"])

    # a condition the scores do not meet: the job fails in one line, judged on the finished results
    result = torchx(eval_args(two, sft_1x2, "1x2") + ["require=[sft.contains >= 0.5]"], tmp_path)
    assert result.returncode == 1
    said = result.stdout + result.stderr
    assert re.search(r"posttrain: require: sft.contains >= 0.5 does not hold: sft.contains [\d.e-]+$", said, re.M), said

    # one process: each prompt's samples come from its own seed, so the same samples, the same scores
    one = tmp_path / "one"
    run_eval(tmp_path, one, sft_1x2, "1x1")
    assert (one / "eval_samples.jsonl").read_text().splitlines() == samples

    # killed half-way: the prompts finished stay, only the rest are sampled (on another number of processes)
    (one / "eval_summary.json").unlink()
    (one / "eval_samples.jsonl").unlink()
    (one / "eval_parts").mkdir()
    (one / "eval_parts" / "rank-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in finished(samples, 30)))
    run_eval(tmp_path, one, sft_1x2, "1x2")
    resumed = [json.loads(line) for line in (one / "eval_samples.jsonl").read_text().splitlines()]
    kept = [sample["index"] < 30 for sample in resumed]
    assert [s["completion"] == "kept" for s in resumed] == kept
    assert [json.loads(line)["completion"] for line in samples if json.loads(line)["index"] >= 30] == [
        s["completion"] for s in resumed if s["index"] >= 30
    ]


def test_a_training_run_ends_with_its_evaluation_before_and_after(two: Path, tmp_path: Path) -> None:
    output_dir = tmp_path / "sft"
    result = run_template("sft/tiny-evaluated.yaml", tmp_path, output_dir)
    assert_succeeded(result)
    said = result.stdout + result.stderr
    run = read_json(output_dir / "run_summary.json")
    summary = read_json(output_dir / "eval" / "eval_summary.json")
    assert run["evaluation"] == summary
    # one closing line: the training's, then the evaluation's
    line = re.search(r"^.*posttrain: sft finished 40 steps in \d+ s, loss .*; model in (.*); (eval of .*)$", said, re.M)
    assert line is not None, said[-3000:]
    assert (line.group(1), "posttrain: " + line.group(2)) == (str(output_dir), summary["closing_line"])
    assert "eval of 2 models (before, after) on 60 prompts" in summary["closing_line"]
    ahead = summary["comparisons"]["after"]["regex_format"]
    assert ahead["mean"] > 0.3 and ahead["mean"] > 4 * ahead["stderr"], ahead
    [verdict] = summary["require"]
    assert verdict["condition"] == "after.regex_format - before.regex_format >= 0.3" and verdict["held"]
    # the evaluation posttrain.eval runs: the model it started from answers as the eval's base did, sample for
    # sample, and the model it trained as the session's SFT model (the same run)
    assert samples_of(output_dir / "eval", "before") == samples_of(two, "base")
    assert samples_of(output_dir / "eval", "after") == samples_of(two, "sft")

    # another evaluation of the finished run: nothing trained, evaluated again, judged in one line
    overrides = [
        "evaluate.generation.num_samples=2",
        "evaluate.pass_at_k=[1]",
        "evaluate.require=[after.contains >= 0.9]",
    ]
    result = run_template("sft/tiny-evaluated.yaml", tmp_path, output_dir, overrides=overrides)
    said = result.stdout + result.stderr
    assert result.returncode == 1 and "already holds this run, finished at step 40: nothing to train" in said
    assert re.search(r"posttrain: require: after.contains >= 0.9 does not hold: after.contains [\d.e-]+$", said, re.M)
    assert read_json(output_dir / "run_summary.json")["evaluation"]["num_samples"] == 2


def test_a_benchmark_task_from_a_local_file_runs_offline_on_each_model(sft_1x2: Path, tmp_path: Path) -> None:
    output_dir = tmp_path / "benchmarks"
    args = ["run", "-s", "local_cwd", "posttrain.eval", "--spec", "templates/eval/benchmarks-tiny.yaml", "-j", "1x2"]
    args += ["--rdzv_port", str(free_port()), f"output_dir={output_dir}", f"models.sft.name_or_path={sft_1x2}"]
    result = torchx(args, tmp_path)
    assert_succeeded(result)
    summary = read_json(output_dir / "eval_summary.json")
    # lm-evaluation-harness's accuracy: the SFT model prefers its data's full stop, the random base half the time
    accuracy = {model: summary["benchmarks"][model]["answer_form"]["acc"] for model in ("base", "sft")}
    assert accuracy["sft"]["value"] - accuracy["base"]["value"] >= 0.3, accuracy
    assert 0.3 < accuracy["base"]["value"] < 0.7 and accuracy["base"]["stderr"] > 0
    assert summary["require"][0]["held"] and summary["prompts"] == 0
    line = f"posttrain: eval of 2 models (base, sft): answer_form acc {accuracy['base']['value']:.2f} -> "
    assert summary["closing_line"].startswith(line) and summary["closing_line"] in result.stdout + result.stderr

    # a task the harness does not know: one line, before any model loads
    result = torchx(
        args + [f"output_dir={tmp_path / 'unknown'}", "benchmarks.tasks=[answer_fom]", "require=[]"], tmp_path
    )
    said = result.stdout + result.stderr
    assert result.returncode == 1
    expected = "lm-evaluation-harness has no task 'answer_fom' (nor in include_path); did you mean answer_form?"
    assert f"posttrain: benchmarks.tasks.0: {expected}" in said, said[-2000:]


def test_a_reward_model_scores_each_sample_as_it_scores_the_text_alone(
    sft_1x2: Path, reward_model: Path, tmp_path: Path
) -> None:
    output_dir = tmp_path / "scored"
    args = eval_args(output_dir, sft_1x2, "1x2") + [f"rewards=[{{model: {reward_model}}}]", "require=[]"]
    args += ["pass_at_k=[1]", "generation.num_samples=2", "data.eval.max_rows=20"]
    result = torchx(args, tmp_path)
    assert_succeeded(result)
    summary = read_json(output_dir / "eval_summary.json")
    assert summary["closing_line"].startswith("posttrain: eval of 2 models (base, sft) on 20 prompts: reward ")
    samples = [json.loads(line) for line in (output_dir / "eval_samples.jsonl").read_text().splitlines()]
    # scored in right-padded batches on two processes; here one text at a time, as the reward test scores pairs
    model = AutoModelForSequenceClassification.from_pretrained(reward_model).eval()
    tokenizer = AutoTokenizer.from_pretrained(reward_model)
    for sample in samples[::5]:
        answer = [{"role": "assistant", "content": sample["completion"]}]
        text = tokenizer.apply_chat_template(sample["prompt"] + answer, tokenize=False)
        with torch.no_grad():
            alone = model(**tokenizer(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item()
        assert sample["scores"]["reward"] == pytest.approx(alone, abs=1e-4), sample
    means = {model: summary["models"][model]["reward"]["mean"] for model in ("base", "sft")}
    assert summary["comparisons"]["sft"]["reward"]["mean"] == pytest.approx(means["sft"] - means["base"])


def finished(samples: List[str], prompts: int) -> List[dict]:
    """The results of the first ``prompts`` prompts as the job writes them while it runs, each completion replaced
    by ``kept`` (so the summary shows which were sampled again)."""
    grouped = collections.defaultdict(list)
    for line in samples:
        sample = json.loads(line)
        if sample["index"] < prompts:
            grouped[(sample["model"], sample["index"])].append(sample)
    return [
        {
            "model": model,
            "index": index,
            "prompt": group[0]["prompt"],
            "completions": ["kept"] * len(group),
            "scores": {name: [s["scores"][name] for s in group] for name in group[0]["scores"]},
        }
        for (model, index), group in grouped.items()
    ]


SCORER = "def mine(completions, **columns):\n    return [{score} for _ in completions]\n"


def test_a_gate_judges_only_what_the_evaluation_wrote_with_the_scorers_it_names(tmp_path: Path) -> None:
    """Through real runs of posttrain.eval: a scorer's code changed re-scores the samples kept, without sampling
    again; a condition on too few scored samples does not hold, and says why; a summary edited by hand is refused
    in one line."""
    (tmp_path / "scorers").mkdir()
    scorer = tmp_path / "scorers" / "my_scorer.py"
    scorer.write_text(SCORER.format(score="1.0"))
    rows = (REPO / "templates/data/questions_heldout.jsonl").read_text().splitlines()[:8]
    (tmp_path / "prompts.jsonl").write_text("\n".join(rows) + "\n")
    output_dir = tmp_path / "eval"
    spec = tmp_path / "eval.yaml"
    spec.write_text(
        f"algorithm: eval\noutput_dir: {output_dir}\nmodels:\n  base: {{name_or_path: 'builtin:tiny-llama'}}\n"
        f"data:\n  eval: {{path: {tmp_path / 'prompts.jsonl'}}}\n"
        "generation: {num_samples: 2, temperature: 1.0, max_new_tokens: 8}\n"
        "rewards:\n  - function: my_scorer:mine\nrequire: [base.mine >= 0.5]\n"
    )

    def run(*overrides: str) -> subprocess.CompletedProcess:
        args = ["run", "-s", "local_cwd", "posttrain.eval", "--spec", str(spec), "-j", "1x1"]
        return torchx([*args, "--rdzv_port", str(free_port()), *overrides], tmp_path, PYTHONPATH=str(scorer.parent))

    assert_succeeded(run())
    sampled = [json.loads(line) for line in (output_dir / "eval_samples.jsonl").read_text().splitlines()]
    assert len(sampled) == 16 and {sample["scores"]["mine"] for sample in sampled} == {1.0}

    # the scorer's code changed: the same completions, scored again; the gate judges the new scores
    scorer.write_text(SCORER.format(score="0.25"))
    result = run()
    assert result.returncode == 1
    said = result.stdout + result.stderr
    assert "re-scoring the 8 prompt result(s) kept, without sampling again" in said, said[-3000:]
    assert "posttrain: require: base.mine >= 0.5 does not hold: base.mine 0.25" in said, said[-3000:]
    rescored = [json.loads(line) for line in (output_dir / "eval_samples.jsonl").read_text().splitlines()]
    assert [s["completion"] for s in rescored] == [s["completion"] for s in sampled]
    assert {sample["scores"]["mine"] for sample in rescored} == {0.25}

    # too few scored samples for a condition: it does not hold, whatever the scores, and says why
    scorer.write_text(SCORER.format(score="1.0"))
    result = run("require_min_samples=17")
    assert result.returncode == 1
    assert (
        "posttrain: require: base.mine >= 0.5 does not hold: base.mine n/a (base.mine scored 16 sample(s), fewer "
        "than the 17 a condition needs (require_min_samples))" in result.stdout + result.stderr
    )
    assert_succeeded(run())

    # a summary edited by hand: no gate judges it
    summary = read_json(output_dir / "eval_summary.json")
    summary["models"]["base"]["mine"]["mean"] = 0.9
    (output_dir / "eval_summary.json").write_text(json.dumps(summary))
    assert_stopped_once(
        run(),
        f"output_dir: {output_dir / 'eval_summary.json'} is not as the evaluation wrote it (edited by hand, or "
        "written by another tool), so no gate judges it; remove the directory's eval_* files to evaluate again, or "
        "use another output_dir",
    )
