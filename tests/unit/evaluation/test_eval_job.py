"""posttrain.eval's job, its parts without a model: its spec read once, the part file a kill cut short, and the
scorers' scores."""

import json
import signal
from pathlib import Path
from typing import Any, List

import pytest

from helpers import TEMPLATES
from posttrain.components.spec.evaluation import load_eval
from posttrain.components.spec.judging import GenerationSpec
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints import launcher
from posttrain.entrypoints.evaluation import parts as eval_parts
from posttrain.entrypoints.evaluation import results, sampling, scoring
from posttrain.entrypoints.evaluation import run as eval_job
from posttrain.entrypoints.inputs.rewards import RewardCheck


def test_a_line_a_kill_cut_short_is_cut_off_before_the_next_result(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    first = {"model": "base", "index": 0, "prompt": "p", "completions": ["a"], "scores": {"s": [1.0]}}
    path.write_text(json.dumps(first) + "\n" + '{"model": "base", "index": 2, "pro')
    with results.part(path) as part:
        part.write(json.dumps({**first, "index": 4}) + "\n")
    assert [result["index"] for result in results.parts(tmp_path)] == [0, 4]
    assert results.done(tmp_path) == {("base", 0), ("base", 4)}


def numpy_like(prompts: List[Any], completions: List[Any], **columns: Any) -> List[Any]:
    import numpy

    return [numpy.float32(1.0), None]


async def awaited(prompts: List[Any], completions: List[Any], **columns: Any) -> List[float]:
    return [0.0, 1.0]


def test_scores_are_numbers_an_async_scorer_is_awaited_and_a_bad_score_is_this_ranks_to_say() -> None:
    check = RewardCheck(stop_at_step_end=False)
    assert scoring.scores(check.wrap(numpy_like, "rewards.0"), ["p", "p"], ["a", "b"], {}) == [1.0, None]
    assert scoring.scores(check.wrap(awaited, "rewards.1"), ["p", "p"], ["a", "b"], {}) == [0.0, 1.0]
    with pytest.raises(SpecError) as error:
        scoring.scores(check.wrap(lambda prompts, completions: ["high"] * 2, "rewards.2"), ["p"] * 2, ["a", "b"], {})
    assert error.value.this_rank_only and error.value.problems[0].startswith("rewards.2")


def test_a_stopped_evaluation_is_told_it_keeps_the_prompts_it_finished(tmp_path: Path) -> None:
    argv = ["-m", "posttrain.entrypoints.eval", "--spec-json", json.dumps({"output_dir": str(tmp_path)})]
    line = launcher.stopped_line(signal.SIGTERM, argv)
    assert (
        line
        == f"posttrain: stopped by SIGTERM: the same command again samples only the prompts not finished in {tmp_path}"
    )


def test_another_evaluation_or_a_training_run_in_output_dir_is_one_line_naming_the_key(tmp_path: Path) -> None:
    record = {"spec": {"pass_at_k": [1]}, "models": {}, "data": {}}
    (tmp_path / "run_summary.json").write_text("{}")
    with pytest.raises(SpecError) as error:
        results.finished(tmp_path, record, overwrite=True)
    assert error.value.problems == [
        f"output_dir: {tmp_path} holds a training run (run_summary.json); use another output_dir for the eval"
    ]
    other = tmp_path / "other"
    other.mkdir()
    (other / "eval_spec.json").write_text(json.dumps({**record, "spec": {"pass_at_k": [2]}}))
    with pytest.raises(SpecError) as error:
        results.finished(other, record, overwrite=False)
    assert error.value.problems == [
        f"output_dir: {other} holds another evaluation's results (they differ in spec.pass_at_k); use another "
        "output_dir, or overwrite_output_dir: true to replace them"
    ]
    # replaced when told; the same evaluation, unfinished, goes on; its scorers alone changed: re-scored
    assert results.finished(other, record, overwrite=True) == (None, False)
    (other / "eval_spec.json").write_text(json.dumps(record))
    assert results.finished(other, record, overwrite=False) == (None, False)
    scored_anew = {**record, "scorers": {"0": {"code": "another digest"}}}
    assert results.finished(other, scored_anew, overwrite=False) == (None, True)
    # what it samples from changed (a model's weights, an episode's tool): the same evaluation, sampled again
    for changed in ({"models": {"a": {"files": {"model.safetensors": "new"}}}}, {"agent": {"tools": ["new"]}}):
        assert results.finished(other, {**record, **changed}, overwrite=False) == (None, False)


def test_the_engine_is_vllm_where_installed_unless_the_spec_names_one(monkeypatch: pytest.MonkeyPatch) -> None:
    installed = {"vllm": object()}
    monkeypatch.setattr(sampling.importlib.util, "find_spec", lambda name: installed.get(name))
    assert [sampling.engine(GenerationSpec(engine=name)) for name in ("auto", "transformers", "vllm")] == [
        "vllm",
        "transformers",
        "vllm",
    ]
    installed.clear()
    assert sampling.engine(GenerationSpec()) == "transformers"
    with pytest.raises(SpecError, match="generation.engine: vllm is not installed in the job's environment"):
        sampling.engine(GenerationSpec(engine="vllm"))


def test_an_evaluation_is_read_once_into_its_parts_and_its_results_do_not_depend_on_where_they_go() -> None:
    spec = load_eval(str(TEMPLATES / "eval/sft-tiny.yaml"), ["models.sft.name_or_path=/runs/sft"])
    read = eval_parts.parts(spec)
    assert (read.output_dir, read.overwrite, list(read.models)) == (
        Path("outputs/eval-sft-tiny"),
        False,
        ["base", "sft"],
    )
    assert read.named_models == (
        ("models.base.name_or_path", "builtin:tiny-llama"),
        ("models.sft.name_or_path", "/runs/sft"),
    )
    assert (read.scorer_names, read.pass_at_k) == (("contains", "regex_format"), (1, 4))
    assert read.require == ("sft.regex_format - base.regex_format >= 0.3",)
    # another place, the right to replace, other conditions: the same results
    elsewhere = load_eval(
        str(TEMPLATES / "eval/sft-tiny.yaml"),
        ["models.sft.name_or_path=/runs/sft", "output_dir=/elsewhere", "overwrite_output_dir=true", "require=[]"],
    )
    assert eval_parts.parts(elsewhere).results_spec == read.results_spec
    assert read.results_spec["models"]["sft"]["name_or_path"] == "/runs/sft"
    assert not {"output_dir", "overwrite_output_dir", "require"} & set(read.results_spec)


def test_episodes_of_a_model_whose_template_renders_no_calls_are_one_line_before_it_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As GRPO's check: the tokenizer alone says it, before any model loads (the run's own, made later, skipped)."""
    monkeypatch.chdir(TEMPLATES.parent)
    spec = load_eval("eval/tools-tiny", ["models={base: {name_or_path: 'builtin:tiny-llama'}}", "require=[]"])
    with pytest.raises(SpecError) as error:
        eval_job.check(eval_parts.parts(spec))
    assert error.value.problems[0].startswith(
        "tools: builtin:tiny-llama's chat template does not render tool calls and their results"
    )
    assert eval_job.check(eval_parts.parts(spec), made_later=["builtin:tiny-llama"]).agent is not None
    # a template that renders them: episodes, played in vLLM where it is installed, as completions are
    tools = load_eval("eval/tools-tiny", ["models={base: {name_or_path: 'builtin:tiny-tools'}}", "require=[]"])
    monkeypatch.setattr(sampling.importlib.util, "find_spec", lambda name: object())
    assert eval_job.check(eval_parts.parts(tools)).engine == "vllm"
