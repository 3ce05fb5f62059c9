"""posttrain.eval before it runs: its spec, each refusal in one line, its templates, and its request; and a
training spec's ``evaluate:`` section, the same evaluation of the run's model."""

from pathlib import Path
from typing import Any, Dict, List

import pytest
from torchx.runner import get_runner
from torchx.schedulers.kubernetes_scheduler import sanitize_for_serialization

from helpers import TEMPLATES, load_template
from kubernetes_checks import check
from posttrain.components import algorithms
from posttrain.components.spec import conditions
from posttrain.components.spec.evaluation import eval_from_json, load_eval, of_training_run, validate_eval
from posttrain.components.spec.loading import load_spec, training_relevant, validate
from posttrain.components.spec.local_files import local_data_problems
from posttrain.components.spec.messages import SpecError

EVAL_TEMPLATES = sorted(str(p.relative_to(TEMPLATES)) for p in TEMPLATES.glob("eval/*.yaml"))


def problems(raw: Dict[str, Any]) -> List[str]:
    with pytest.raises(SpecError) as error:
        validate_eval(raw)
    return error.value.problems


def sft_tiny(**changes: Any) -> Dict[str, Any]:
    return {**load_template("eval/sft-tiny.yaml"), **changes}


@pytest.mark.parametrize("template", EVAL_TEMPLATES)
def test_every_eval_template_validates_and_round_trips(template: str) -> None:
    spec = validate_eval(load_template(template))
    assert eval_from_json(spec.to_json()) == spec


def test_a_scorer_is_named_by_its_builtin_its_function_or_its_reward_models_folder() -> None:
    rewards = [{"builtin": "contains", "args": {"column": "answer"}}, {"function": "my_scores:Judge.correct"}]
    rewards += [{"model": "outputs/reward-tiny/"}, {"model": "Org/RM-7B"}]
    assert validate_eval(sft_tiny(rewards=rewards, require=[])).scorer_names() == [
        "contains",
        "correct",
        "reward_tiny",
        "RM_7B",
    ]


def test_models_keep_their_order_the_first_is_the_baseline() -> None:
    spec = load_eval(str(TEMPLATES / "eval/sft-tiny.yaml"), ["models.sft.name_or_path=/runs/sft", "pass_at_k=[2]"])
    assert list(spec.models) == ["base", "sft"] and spec.models["sft"].name_or_path == "/runs/sft"
    assert list(eval_from_json(spec.to_json()).models) == ["base", "sft"]
    assert spec.named_models() == [
        ("models.base.name_or_path", "builtin:tiny-llama"),
        ("models.sft.name_or_path", "/runs/sft"),
    ]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"algorithm": "sft"}, "algorithm: expected eval for posttrain.eval; got 'sft'"),
        ({"generation": {"num_sample": 2}}, "generation.num_sample: unknown key; did you mean generation.num_samples?"),
        ({"data": {"train": {"path": "x.jsonl"}, "eval": {"path": "y.jsonl"}}}, "data.train: an evaluation reads"),
        ({"models": {}}, "models: name at least one model"),
        ({"models": {"Base": {"name_or_path": "x"}}}, "models.Base: a model's name is lowercase letters"),
        ({"models": {"a": {"name_or_path": "x", "lora": {"r": 8}}}}, "models.a.lora: an evaluation loads models as"),
        ({"rewards": []}, "rewards: name at least one scorer"),
        ({"rewards": [{"model": ""}]}, "rewards.0.model: expected a path or hub id of a reward model; got an empty"),
        ({"rewards": [{"builtin": "contains", "args": {"target": "a"}, "weight": 2.0}]}, "rewards.0.weight: an eval"),
        ({"rewards": [{"builtin": "containz"}]}, "rewards.0.builtin: unknown built-in reward 'containz'"),
        ({"pass_at_k": [8]}, "pass_at_k: 8 needs at least 8 samples per prompt; expected 1 to generation.num_samples"),
        ({"generation": {"num_samples": 4, "temperature": 0.0}}, "generation.num_samples: 4 greedy samples are one"),
        ({"generation": {"top_p": 0.0}}, "generation.top_p: expected a value in (0, 1]; got 0.0"),
        ({"generation": {"max_new_tokens": 0}}, "generation.max_new_tokens: expected 1 or more; got 0"),
        ({"generation": {"temperature": 0.0, "top_p": 0.9}}, "generation.top_p: 0.9 does nothing when greedy"),
        ({"generation": {"seed": 2**40}}, "generation.seed: expected 0 to 2**32 - 1; got 1099511627776"),
        ({"generation": {"vllm_timeout_s": 0}}, "generation.vllm_timeout_s: expected seconds above 0; got 0"),
        (
            {"require": ["sft.regex >= 0.3"]},
            "require.0: no scorer or benchmark task 'regex' in this evaluation; it has contains, regex_format",
        ),
        ({"require": ["trained.contains > 0"]}, "require.0: no model 'trained' in this evaluation; it has base, sft"),
        ({"require": ["sft.contains.pass@2 > 0"]}, "require.0: pass@2 is not computed; add 2 to pass_at_k"),
        ({"require": ["sft.contains = 1"]}, "require.0: 'sft.contains = 1': expected <model>.<scorer> (or a differ"),
        ({"require": ["sft.contains - sft.contains > 0"]}, "compares sft.contains with itself; name another model's"),
        (
            {"rewards": [{"builtin": "contains", "args": {"target": "a"}}] * 2 + [{"function": "m:Judge.contains_1"}]},
            "rewards.1: its name in the summary, contains_1, is another scorer's too; give the function another name",
        ),
    ],
)
def test_a_malformed_eval_is_refused_in_one_line(changes: Dict[str, Any], message: str) -> None:
    found = problems(sft_tiny(**changes))
    assert any(message in problem for problem in found), found


def test_an_eval_makes_a_valid_volcano_job() -> None:
    app = algorithms.eval(
        "models.sft.name_or_path=/runs/sft",
        spec=str(TEMPLATES / "eval/sft-tiny.yaml"),
        image="registry.example/posttrain:1",
        j="2x2",
        rdzv_port=29511,
    )
    with get_runner() as runner:
        job = sanitize_for_serialization(runner.dryrun(app, "kubernetes", cfg={"queue": "default"}).request.resource)
    check(job)
    command = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["command"][2]
    assert "-m posttrain.entrypoints.eval --spec-json" in command
    assert "/runs/sft" in command
    # two nodes: the port checked free first, then the launcher in bash's place
    assert command.startswith("python -m posttrain.entrypoints.rendezvous_port 29511")
    assert "&& exec python -m posttrain.entrypoints.launcher" in command
    assert "--rdzv_endpoint ${TORCHX_RANK0_HOST:=localhost}:29511" in command


SUMMARY = {
    "models": {
        "base": {"contains": {"mean": 0.25, "pass_at_k": {"4": 0.5}, "samples": 32}},
        "sft": {
            "contains": {"mean": 0.75, "pass_at_k": {"4": 1.0}, "samples": 32},
            "never": {"prompts": 0, "samples": 0},
            "few": {"mean": 1.0, "samples": 3},
        },
    }
}


@pytest.mark.parametrize(
    "text, held, value",
    [
        ("sft.contains >= 0.75", True, 0.75),
        ("sft.contains > 0.75", False, 0.75),
        ("sft.contains - base.contains >= 0.5", True, 0.5),
        ("  sft.contains-base.contains   >   0.6 ", False, 0.5),
        ("base.contains.pass@4 < 0.6", True, 0.5),
        ("sft.contains.pass@4 - base.contains.pass@4 >= 5e-1", True, 0.5),
        # nothing scored: it cannot hold
        ("sft.never >= 0", False, None),
    ],
)
def test_a_condition_is_judged_on_the_summary(text: str, held: bool, value: Any) -> None:
    verdict = conditions.Condition.parse(text).verdict(SUMMARY)
    assert (verdict["held"], verdict["value"]) == (held, value)


def test_a_condition_that_fails_is_one_line_with_its_values() -> None:
    verdict = conditions.Condition.parse("sft.contains - base.contains >= 0.6").verdict(SUMMARY)
    assert conditions.failure(verdict) == (
        "require: sft.contains - base.contains >= 0.6 does not hold: sft.contains 0.75, base.contains 0.25; "
        "difference 0.5"
    )
    verdict = conditions.Condition.parse("sft.never > 0").verdict(SUMMARY)
    assert conditions.failure(verdict) == (
        "require: sft.never > 0 does not hold: sft.never n/a (sft.never scored 0 sample(s), fewer than the 16 a "
        "condition needs (require_min_samples))"
    )


def test_a_condition_on_too_few_scored_samples_does_not_hold_and_says_so_whatever_their_scores() -> None:
    verdict = conditions.Condition.parse("sft.few >= 0.5").verdict(SUMMARY)
    assert not verdict["held"] and "sft.few scored 3 sample(s), fewer than the 16" in conditions.failure(verdict)
    assert conditions.Condition.parse("sft.few >= 0.5").verdict(SUMMARY, min_samples=3)["held"]


@pytest.mark.parametrize("text", ["sft.absent >= 0", "other.contains >= 0", "sft.contains.pass@2 >= 0"])
def test_a_condition_on_a_metric_the_results_lack_is_one_line_never_a_traceback(text: str) -> None:
    verdict = conditions.Condition.parse(text).verdict(SUMMARY)
    assert not verdict["held"]
    assert conditions.failure(verdict).endswith("is not in the results)")


def test_numbers_yaml_1_1_reads_as_text_are_numbers(tmp_path: Path) -> None:
    """PyYAML reads 7e-1 as text; an evaluation's number fields take it as written, as training's do."""
    text = (TEMPLATES / "eval/sft-tiny.yaml").read_text().replace("temperature: 1.0", "temperature: 7e-1")
    (tmp_path / "eval.yaml").write_text(text.replace("templates/data/", str(TEMPLATES / "data") + "/"))
    assert load_eval(str(tmp_path / "eval.yaml")).generation.temperature == 0.7


def evaluated_sft(*overrides: str) -> Any:
    return load_spec(str(TEMPLATES / "sft/tiny-evaluated.yaml"), list(overrides))


def test_a_training_runs_evaluation_is_posttrain_eval_of_its_start_and_its_saved_model() -> None:
    spec = evaluated_sft(
        "training.output_dir=/runs/sft/",
        "model.attn_implementation=torch_varlen",
        "model.dtype=float32",
        "model.lora={r: 8}",
    )
    evaluation = of_training_run(spec)
    assert evaluation.output_dir == "/runs/sft/eval" and evaluation.overwrite_output_dir
    assert list(evaluation.models) == ["before", "after"]
    before, after = evaluation.models["before"], evaluation.models["after"]
    # as they generate: torch_varlen takes no KV cache; the adapter's base as it was, the run's saved model
    assert (before.name_or_path, before.lora, before.attn_implementation) == ("builtin:tiny-llama", None, None)
    assert (after.name_or_path, after.dtype) == ("/runs/sft", "float32")
    assert (evaluation.data, evaluation.rewards, evaluation.require) == (
        spec.evaluate.data,
        spec.evaluate.rewards,
        ["after.regex_format - before.regex_format >= 0.3"],
    )
    # without before: the trained model alone
    assert list(of_training_run(evaluated_sft("evaluate.before=false", "evaluate.require=[]")).models) == ["after"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["evaluate.seed=1"], "evaluate.seed: unknown key here; it belongs at evaluate.generation.seed"),
        (["evaluate.require=[sft.contains >= 0.5]"], "evaluate.require.0: no model 'sft' in this evaluation; it has "),
        (["evaluate.before=false"], "evaluate.require.0: no model 'before' in this evaluation; it has after"),
        (["evaluate.generation.top_p=0"], "evaluate.generation.top_p: expected a value in (0, 1]; got 0"),
        (["evaluate.rewards=[]"], "evaluate.rewards: name at least one scorer"),
        (["evaluate.pass_at_k=[8]"], "evaluate.pass_at_k: 8 needs at least 8 samples per prompt"),
    ],
)
def test_a_malformed_evaluate_section_is_refused_in_one_line(overrides: List[str], message: str) -> None:
    with pytest.raises(SpecError) as error:
        evaluated_sft(*overrides)
    assert any(problem.startswith(message) for problem in error.value.problems), error.value.problems


def test_an_evaluate_sections_data_is_checked_by_the_client_as_the_runs_is() -> None:
    wrong = evaluated_sft("evaluate.data.eval.path=templates/data/sft_chat.jsonl")
    assert local_data_problems(wrong) == [
        "evaluate.data.eval: found columns ['messages']; expected (prompt) (map names with evaluate.data.columns)"
    ]
    assert local_data_problems(evaluated_sft()) == []


def test_an_evaluate_section_never_decides_whether_a_run_resumes() -> None:
    assert not training_relevant("evaluate.generation.num_samples") and not training_relevant("evaluate")
    assert training_relevant("training.max_steps") and training_relevant("evaluated")
    # how long the job waits changes no checkpoint; a built-in reward's own limit changes its scores
    assert not training_relevant("rewards.0.timeout_s") and not training_relevant("distributed.timeout_s")
    assert training_relevant("rewards.0.args.timeout_s")


BENCHMARKED = {
    "models": {"base": {}, "sft": {}},
    "benchmarks": {
        "base": {"answer_form": {"acc": {"value": 0.5, "stderr": 0.06}}},
        "sft": {"answer_form": {"acc": {"value": 1.0, "stderr": 0.0}}},
    },
}


@pytest.mark.parametrize(
    "text, held, value",
    [
        ("sft.answer_form.acc - base.answer_form.acc >= 0.3", True, 0.5),
        ("base.answer_form.acc > 0.5", False, 0.5),
        # a metric the task does not have: it cannot hold
        ("sft.answer_form.exact_match >= 0", False, None),
    ],
)
def test_a_condition_on_a_benchmark_task_is_judged_on_its_metric(text: str, held: bool, value: Any) -> None:
    verdict = conditions.Condition.parse(text).verdict(BENCHMARKED)
    assert (verdict["held"], verdict["value"]) == (held, value)


def benchmarks_only(**changes: Any) -> Dict[str, Any]:
    return {**load_template("eval/benchmarks-tiny.yaml"), **changes}


def test_an_evaluation_of_benchmarks_alone_needs_no_prompts_nor_scorers() -> None:
    spec = validate_eval(benchmarks_only())
    assert spec.data is None and spec.rewards == [] and spec.benchmarks.tasks == ["answer_form"]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"benchmarks": None}, "data.eval: give held-out prompts (data.eval) and scorers (rewards), or benchmarks"),
        ({"rewards": [{"builtin": "contains", "args": {"column": "answer"}}]}, "data.eval: the scorers (rewards)"),
        ({"benchmarks": {"tasks": []}}, "benchmarks.tasks: name at least one task"),
        ({"benchmarks": {"tasks": ["gsm8k; rm"]}}, "benchmarks.tasks.0: expected a task name; got 'gsm8k; rm'"),
        ({"benchmarks": {"tasks": ["gsm8k"], "limit": 0}}, "benchmarks.limit: expected 1 or more; got 0"),
        ({"require": ["sft.answer_form >= 0.5"]}, "require.0: name the task's metric: sft.answer_form.<metric>"),
        ({"require": ["sft.gsm8k.acc >= 0.5"]}, "require.0: no scorer or benchmark task 'gsm8k' in this evaluation"),
    ],
)
def test_a_malformed_benchmarks_section_is_refused_in_one_line(changes: Dict[str, Any], message: str) -> None:
    assert any(problem.startswith(message) for problem in problems(benchmarks_only(**changes)))


def test_a_task_named_as_a_scorer_is_refused() -> None:
    raw = sft_tiny(benchmarks={"tasks": ["contains"]})
    assert "benchmarks.tasks: contains is also a scorer's name; a condition could not tell them apart" in problems(raw)


def test_an_evaluate_section_on_a_reward_model_is_refused() -> None:
    raw = {**load_template("reward/tiny.yaml"), "evaluate": load_template("sft/tiny-evaluated.yaml")["evaluate"]}
    with pytest.raises(SpecError) as error:
        validate(raw)
    assert error.value.problems == [
        "evaluate: posttrain.reward trains a SequenceClassification model, which an evaluation cannot sample from; "
        "evaluate a policy it scores (rewards: [{model: ...}])"
    ]


def test_an_evaluation_of_agents_takes_grpos_tools_environments_and_turn_limit() -> None:
    spec = load_eval("eval/tools-tiny")
    assert spec.environment is not None and spec.generation.max_tool_calling_iterations == 2
    assert spec.scorer_names() == ["exact_match", "Room"]
    named = load_template("eval/tools-tiny.yaml")
    named["environment"] = {"lamp": {"factory": "my_env:Lamp"}, "safe": {"factory": "my_env:Safe"}}
    named["require"] = ["grpo.lamp >= 0.5", "grpo.episodes.turns <= 2"]
    assert validate_eval(named).scorer_names() == ["exact_match", "lamp", "safe"]


@pytest.mark.parametrize(
    "change, problem",
    [
        (
            {"environment": None},
            "generation.max_tool_calling_iterations: 2 bounds the rounds of tool calls in an episode, and the spec gives "
            "no tools and no environment; add them, or drop it",
        ),
        (
            {"require": ["grpo.episodes.calls_made >= 1"]},
            "require.0: grpo.episodes.calls_made is not counted; an episode counts calls, failed_calls, turns, "
            "hit_limit, tokens, errors",
        ),
        (
            {"tools": [{"function": "not a path"}]},
            "tools.0.function: expected module:function (e.g. my_tools:lookup); got 'not a path'",
        ),
    ],
)
def test_an_evaluation_of_agents_is_checked_at_submit_as_grpo_is(change: Dict[str, Any], problem: str) -> None:
    raw = {**load_template("eval/tools-tiny.yaml"), **change}
    with pytest.raises(SpecError) as error:
        validate_eval(raw)
    assert problem in error.value.problems, error.value.problems


def test_an_agent_program_scores_by_its_function_and_plays_alone() -> None:
    spec = load_eval("eval/agent-rooms-tiny")
    assert spec.is_agentic() and spec.scorer_names() == ["exact_match", "solve"]
    assert spec.agent is not None and spec.agent.function == "posttrain.templates.agents.rooms:solve"
    raw = load_template("eval/agent-rooms-tiny.yaml")
    # its reward alone scores: no rewards needed, and its episodes counted for conditions
    assert validate_eval({**raw, "rewards": [], "require": ["grpo.episodes.errors <= 0.1"]}).scorer_names() == ["solve"]


@pytest.mark.parametrize(
    "change, problem",
    [
        (
            {"environment": {"factory": "posttrain.templates.tools.hidden_value:Room"}},
            "agent: an agent program makes its own calls through the endpoint; give tools and environment, or agent, "
            "not both",
        ),
        (
            {"generation": {"max_tool_calling_iterations": 2}},
            "generation.max_tool_calling_iterations: an agent program bounds its own rounds; drop it",
        ),
        (
            {"rewards": [{"function": "my_scores:solve"}]},
            "agent.function: its reward's name in the summary, solve, is another scorer's too; give the function "
            "another name",
        ),
        (
            {"agent": {"function": "rooms.solve"}},
            "agent.function: expected module:function (e.g. my_agent:solve); got 'rooms.solve'",
        ),
        (
            {"agent": {"function": "rooms:solve", "timeout_s": 0}},
            "agent.timeout_s: expected seconds above 0 (unset: 600); got 0",
        ),
    ],
)
def test_an_agent_program_is_checked_at_submit(change: Dict[str, Any], problem: str) -> None:
    raw = {**load_template("eval/agent-rooms-tiny.yaml"), **change}
    with pytest.raises(SpecError) as error:
        validate_eval(raw)
    assert problem in error.value.problems, error.value.problems


def test_episode_counts_are_metrics_only_where_the_samples_are_episodes() -> None:
    raw = {**load_template("eval/sft-tiny.yaml"), "require": ["sft.episodes.calls >= 1"]}
    with pytest.raises(SpecError) as error:
        validate_eval(raw)
    assert error.value.problems[0].startswith("require.0: no scorer or benchmark task 'episodes' in this evaluation")
    summary = {"episodes": {"grpo": {"episodes": 128, "calls": 0.9}}}
    verdict = conditions.Condition.parse("grpo.episodes.calls >= 0.8").verdict(summary)
    assert verdict["held"] and verdict["value"] == 0.9
    verdict = conditions.Condition.parse("grpo.episodes.calls >= 0.8").verdict(summary, min_samples=200)
    assert not verdict["held"] and "grpo played 128 episode(s), fewer than the 200" in verdict["why"]


def test_a_model_trained_with_an_environment_is_evaluated_in_it_unless_the_section_names_its_own() -> None:
    evaluate = (
        "evaluate={data: {eval: {path: templates/data/hidden_values_heldout.jsonl}}, rewards: [{builtin: exact_match}],"
        " generation: {num_samples: 4}, require: [after.episodes.calls >= 0.8]}"
    )
    spec = load_spec(str(TEMPLATES / "grpo/tiny-tools.yaml"), [evaluate])
    evaluation = of_training_run(spec)
    assert evaluation.environment == spec.environment and evaluation.generation.max_tool_calling_iterations == 2
    own = load_spec(
        str(TEMPLATES / "grpo/tiny-tools.yaml"), [evaluate, "evaluate.environment={factory: 'my_env:Other'}"]
    )
    assert of_training_run(own).environment.factory == "my_env:Other"
    with pytest.raises(SpecError) as error:
        load_spec(str(TEMPLATES / "sft/tiny-evaluated.yaml"), ["evaluate.require=[after.episodes.calls >= 0.8]"])
    assert "evaluate.require.0: no scorer or benchmark task 'episodes'" in error.value.problems[0]


def test_benchmarks_alone_play_no_episodes_and_a_scorer_name_is_one_scorers() -> None:
    grpo = str(TEMPLATES / "grpo/tiny-tools.yaml")
    benchmarks = "evaluate={benchmarks: {tasks: [answer_form], include_path: templates/eval/tasks}}"
    assert load_spec(grpo, [benchmarks]).evaluation_section().environment is None
    raw = {**load_template("eval/tools-tiny.yaml"), "data": None, "rewards": [], "require": []}
    raw["benchmarks"] = {"tasks": ["answer_form"], "include_path": "templates/eval/tasks"}
    with pytest.raises(SpecError) as error:
        validate_eval(raw)
    assert error.value.problems[0].startswith(
        "data.eval: tools, environments and agents play episodes of held-out prompts"
    )
    raw = {**load_template("eval/tools-tiny.yaml"), "rewards": [{"function": "my_scores:Room"}], "require": []}
    with pytest.raises(SpecError) as error:
        validate_eval(raw)
    assert (
        error.value.problems[0]
        == "rewards.0: its name in the summary, Room, is another scorer's too; give the function another name"
    )
