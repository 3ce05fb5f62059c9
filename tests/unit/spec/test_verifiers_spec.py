"""A verifiers environment in a spec (``environment: {verifiers: <taskset id>}``): its taskset is the data where the
spec gives none, it plays as an agent program does, and what cannot go with it is one line each."""

from typing import Any, Dict

import jsonschema
import pytest

from posttrain.components.generate.schema_json import eval_schema, spec_schema
from posttrain.components.spec.evaluation import validate_eval
from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.sections import VerifiersEnvironment, VerifiersTaskset

TASKSET = "my_tasks.say_digit"


def grpo(**changes: Any) -> Dict[str, Any]:
    raw = {
        "algorithm": "grpo",
        "model": {"name_or_path": "builtin:tiny-tools"},
        "environment": {"verifiers": TASKSET, "args": {"num_tasks": 8}},
        "training": {"output_dir": "out", "per_device_train_batch_size": 8, "num_generations": 8},
    }
    return {**raw, **changes}


def problems(raw: Dict[str, Any], **kwargs: Any) -> list:
    with pytest.raises(SpecError) as raised:
        validate(raw, **kwargs)
    return raised.value.problems


def test_the_taskset_is_the_data_and_the_environment_plays_it_as_a_program() -> None:
    spec = validate(grpo())
    [(where, source)] = spec.data.sources("train")
    assert (where, source.verifiers) == ("data.train", VerifiersTaskset(id=TASKSET, args={"num_tasks": 8}))
    assert spec.program() == VerifiersEnvironment(verifiers=TASKSET, args={"num_tasks": 8})
    assert spec.environment_classes() is None
    # its reward is named by the taskset's module, as the logs write it (rewards/say_digit/mean)
    assert spec.program().scorer_name() == "say_digit"
    assert VerifiersEnvironment(verifiers="owner/say-digit@0.1.0").scorer_name() == "say_digit"
    # the job reads the serialized spec: the data written out, the same spec again
    assert validate(spec.model_dump(mode="json", exclude_defaults=True)) == spec
    # the same taskset written as the data, explicitly, is the same spec
    explicit = grpo(data={"train": {"verifiers": {"id": TASKSET, "args": {"num_tasks": 8}}}})
    assert validate(explicit) == spec


def test_an_evaluation_plays_the_taskset_s_tasks_as_its_prompts() -> None:
    raw = {
        "algorithm": "eval",
        "output_dir": "out",
        "models": {"sft": {"name_or_path": "outputs/sft"}},
        "environment": {"verifiers": TASKSET, "timeout_s": 30},
        "require": ["sft.say_digit >= 0.5"],
    }
    spec = validate_eval(raw)
    assert spec.data.sources("eval")[0][1].verifiers == VerifiersTaskset(id=TASKSET)
    assert spec.scorer_names() == ["say_digit"]
    jsonschema.validate(raw, eval_schema())


@pytest.mark.parametrize(
    "changes, line",
    [
        (
            {"data": {"train": {"path": "rows.jsonl"}}},
            "data.train: a verifiers environment plays its taskset's tasks, not rows of a file; drop data (the "
            "taskset's tasks are the rows), or give data.train: {verifiers: {id: ..., args: {...}}}",
        ),
        (
            {"tools": [{"function": "my_tools:add"}]},
            "tools: a verifiers environment serves its taskset's own tools; drop tools",
        ),
        (
            {"agent": {"function": "my_agent:solve"}},
            "agent: an agent program makes its own calls through the endpoint; give tools and environment, or agent, "
            "not both",
        ),
        (
            {"environment": {"verifiers": TASKSET, "factory": "my_env:Game"}},
            "environment: factory and verifiers are keys of two kinds of environment; give the keys of one",
        ),
        ({"environment": {"verifiers": " "}}, "environment.verifiers: expected a taskset's id; got an empty string"),
        (
            {"data": {"train": {"verifiers": {"id": TASKSET, "args": {"num_tasks": 80}}}}},
            f"data.train.verifiers: the tasks of {TASKSET} with args {{'num_tasks': 80}}, and the environment plays "
            f"those of {TASKSET} with args {{'num_tasks': 8}}; a row is played as its environment's task of its "
            "index: give the same id and args, or drop data",
        ),
    ],
)
def test_what_cannot_go_with_a_verifiers_environment_is_one_line(changes: Dict[str, Any], line: str) -> None:
    assert line in problems(grpo(**changes))


def test_rows_of_a_taskset_without_its_environment_are_refused() -> None:
    raw = {
        "algorithm": "sft",
        "model": {"name_or_path": "builtin:tiny-llama"},
        "data": {"train": {"verifiers": {"id": TASKSET}}},
        "training": {"output_dir": "out"},
    }
    assert problems(raw) == [
        f"data.train.verifiers: a taskset's tasks are played by its environment; give environment: "
        f"{{verifiers: {TASKSET}}} (with posttrain.grpo or posttrain.eval)"
    ]


def test_episodes_that_may_outlast_the_other_processes_wait_name_the_environment_s_key() -> None:
    raw = grpo(environment={"verifiers": TASKSET, "timeout_s": 900})
    [line] = problems(raw, world_size=2)
    assert line.startswith("environment.timeout_s: a process's 8 episodes may take 930 s (environment.timeout_s each")


def test_the_json_schema_takes_a_spec_whose_data_is_its_taskset_and_no_other_without_data() -> None:
    schema = spec_schema("grpo")
    jsonschema.validate(grpo(), schema)
    without = grpo()
    del without["environment"]
    with pytest.raises(jsonschema.ValidationError, match="'data' is a required property"):
        jsonschema.validate(without, schema)
