"""Tools from the spec: the section at submit, and the job's checks of each tool, the chat template and the data
before any model loads (a model calling them: tests/integration/test_tools.py)."""

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset

from helpers import load_template, run_refused
from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.sections import EnvironmentSource, ToolSource
from posttrain.entrypoints.inputs import tiny
from posttrain.entrypoints.inputs.models import load_tokenizer
from posttrain.entrypoints.inputs.tools import (
    check_environment_column,
    check_tool_data,
    check_tool_template,
    resolve_environment,
    resolve_tools,
)

TOOLS = '''
import functools


def lookup(key: str) -> str:
    """The value stored under a key.

    Args:
        key: The key to look up.
    """
    return key


def undocumented(key: str) -> str:
    return key


def untyped(key) -> str:
    """Untyped.

    Args:
        key: The key.
    """
    return key


def unexplained(key: str, default: str) -> str:
    """Its second argument is not described.

    Args:
        key: The key.
    """
    return key


partial = functools.partial(lookup, key="a")


class Vault:
    """An environment: its public methods are the model's tools."""

    def __init__(self, secret: str = "red") -> None:
        self.secret = secret

    def reset(self, **row) -> None:
        self.opened = False

    def open(self, code: str) -> str:
        """Opens the vault.

        Args:
            code: The vault's code.
        """
        return self.secret

    def get_reward(self) -> float:
        return 1.0


class Mute(Vault):
    def get_reward(self):
        raise AttributeError  # not called: only looked for


class Unscored:
    def reset(self, **row) -> None:
        pass


class Resetless:
    def open(self, code: str) -> str:
        """Opens.

        Args:
            code: The code.
        """
        return code


class Undocumented(Vault):
    def shout(self, word: str) -> str:
        return word


class Broken(Vault):
    def __init__(self) -> None:
        raise RuntimeError("no vault server at vault:8200")
'''


@pytest.fixture
def tool_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of tools, importable as the job imports a user's."""
    (tmp_path / "some_tools.py").write_text(TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "some_tools"
    sys.modules.pop("some_tools", None)


def grpo(**changes: Any) -> Any:
    return validate({**load_template("grpo/tiny.yaml"), **changes})


def problems(**changes: Any) -> str:
    with pytest.raises(SpecError) as error:
        grpo(**changes)
    return str(error.value)


def test_tools_are_a_section_of_grpo_and_the_rounds_of_calls_need_them() -> None:
    spec = grpo(tools=[{"function": "my_tools:lookup"}])
    assert spec.tools == [ToolSource(function="my_tools:lookup")]
    assert problems(tools=[{"function": "lookup"}]) == (
        "tools.0.function: expected module:function (e.g. my_tools:lookup); got 'lookup'"
    )
    training = {**load_template("grpo/tiny.yaml")["training"], "max_tool_calling_iterations": 3}
    assert problems(training=training) == (
        "training.max_tool_calling_iterations: 3 bounds the rounds of tool calls in a completion, and the spec "
        "gives no tools and no environment; add them, or drop it"
    )
    grpo(training=training, tools=[{"function": "my_tools:lookup"}])
    # the other algorithms take no tools
    raw = {**load_template("rloo/tiny.yaml"), "tools": [{"function": "my_tools:lookup"}]}
    with pytest.raises(SpecError, match="tools"):
        validate(raw)
    distill = load_template("distill/tiny.yaml")
    distill["training"]["max_tool_calling_iterations"] = 2
    with pytest.raises(
        SpecError,
        match="max_tool_calling_iterations: not supported by posttrain.distill; posttrain's distillation gives",
    ):
        validate(distill)


def test_each_tool_is_what_the_model_can_read_or_one_line_naming_it(tool_module: str) -> None:
    [lookup] = resolve_tools([ToolSource(function=f"{tool_module}:lookup")])
    assert lookup("a") == "a"

    def refusal(name: str) -> str:
        with pytest.raises(SpecError) as error:
            resolve_tools([ToolSource(function=f"{tool_module}:lookup"), ToolSource(function=f"{tool_module}:{name}")])
        return str(error.value)

    assert refusal("undocumented") == (
        "tools.1.function: Cannot generate JSON schema for undocumented because it has no docstring! (the model "
        "sees its docstring and type hints)"
    )
    assert refusal("untyped").startswith("tools.1.function: Argument key is missing a type hint in function untyped")
    assert "has no description for the argument 'default'" in refusal("unexplained")
    assert refusal("partial") == (
        "tools.1.function: some_tools:partial is a partial; a tool is a function (def) with a docstring"
    )
    assert refusal("lookup") == (
        "tools.1.function: some_tools:lookup is named 'lookup', as tools.0 is; the model calls a tool by its name: "
        "rename one"
    )
    assert refusal("nowhere").startswith("tools.1.function: cannot import some_tools:nowhere from ")


def test_the_chat_template_renders_tool_calls_and_trl_reads_them_back(tool_module: str) -> None:
    check_tool_template(tiny.build_tokenizer_tools(), tiny.NAME_TOOLS)
    chatml = load_tokenizer(tiny.NAME, validate(load_template("grpo/tiny.yaml")).model, "left")
    with pytest.raises(SpecError, match=r"^tools: builtin:tiny-llama's chat template does not render tool calls"):
        check_tool_template(chatml, tiny.NAME)
    # a template that renders them, but one TRL cannot parse the calls of
    renders = tiny.build_tokenizer_tools()
    renders.chat_template = renders.chat_template.replace("You are Qwen", "You are a tiny model")
    with pytest.raises(SpecError, match="TRL reads the model's tool calls back only for the chat templates it knows"):
        check_tool_template(renders, "mine")


def test_tools_need_prompts_as_chat_messages() -> None:
    check_tool_data([("data.train", Dataset.from_list([{"prompt": [{"role": "user", "content": "a?"}]}]))])
    with pytest.raises(SpecError) as error:
        check_tool_data([("data.train", Dataset.from_list([{"prompt": "a?"}]))])
    assert str(error.value) == (
        "data.train: tools need prompts as chat messages (a list of {role, content}), and its prompts are text; "
        "write each prompt as [{role: user, content: ...}]"
    )


def test_the_tools_model_renders_a_prompt_with_a_tool_within_its_positions(tool_module: str) -> None:
    tokenizer = tiny.build_tokenizer_tools()
    [lookup] = resolve_tools([ToolSource(function=f"{tool_module}:lookup")])
    question = [{"role": "user", "content": "What is the value of apple?"}]
    prompt = tokenizer.apply_chat_template(question, tools=[lookup], add_generation_prompt=True, return_dict=False)
    assert len(tokenizer) == 512 and len(prompt) < 256  # of the model's 1024 positions
    assert tokenizer.convert_ids_to_tokens(prompt[-3:]) == ["<|im_start|>", "assistant", "Ċ"]


def test_the_job_names_a_tool_it_cannot_offer_before_any_model_loads(
    tool_module: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    prompts = tmp_path / "questions.jsonl"
    prompts.write_text('{"prompt": [{"role": "user", "content": "What is the value of apple?"}]}\n')
    raw = load_template("grpo/tiny.yaml")
    raw.update(model={"name_or_path": tiny.NAME_TOOLS}, data={"train": {"path": str(prompts)}})
    raw["training"]["output_dir"] = str(tmp_path / "out")
    raw["tools"] = [{"function": f"{tool_module}:undocumented"}]
    assert run_refused(raw, monkeypatch, capsys) == (
        "posttrain: tools.0.function: Cannot generate JSON schema for undocumented because it has no docstring! "
        "(the model sees its docstring and type hints)\n"
    )
    # a model whose chat template cannot carry tools: said before it loads
    raw.update(model={"name_or_path": tiny.NAME}, tools=[{"function": f"{tool_module}:lookup"}])
    assert run_refused(raw, monkeypatch, capsys).startswith(
        "posttrain: tools: builtin:tiny-llama's chat template does not render tool calls"
    )


def test_demonstrations_of_tool_calls_load_as_chat_messages(tmp_path: Path) -> None:
    """Messages of different shapes (a call without content, a tool's result) are chat messages all the same."""
    from posttrain.components.spec.registry import SPEC_CLASSES
    from posttrain.components.spec.sections import DataSource
    from posttrain.entrypoints.inputs.data import load_data

    call = {"type": "function", "function": {"name": "lookup", "arguments": {"key": "apple"}}}
    messages = [
        {"role": "user", "content": "What is the value of apple?"},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "name": "lookup", "content": "red"},
        {"role": "assistant", "content": "red"},
    ]
    path = tmp_path / "calls.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n")
    dataset = load_data(DataSource(path=str(path)), {}, "data.train", SPEC_CLASSES["sft"].data_formats)
    assert dataset[0]["messages"][1] == {"role": "assistant", "tool_calls": [call]}
    # a completion that is a call alone: messages of one shape, without content
    path.write_text(json.dumps({"prompt": messages[:1], "completion": messages[1:2]}) + "\n")
    dataset = load_data(DataSource(path=str(path)), {}, "data.train", SPEC_CLASSES["sft"].data_formats)
    assert dataset[0]["completion"] == [{"role": "assistant", "tool_calls": [call]}]
    path.write_text(json.dumps({"messages": [{"role": "assistant"}]}) + "\n")
    with pytest.raises(SpecError, match="data.train: column messages holds lists of objects; expected chat messages"):
        load_data(DataSource(path=str(path)), {}, "data.train", SPEC_CLASSES["sft"].data_formats)


def test_an_environment_is_a_section_of_grpo_in_place_of_or_beside_rewards() -> None:
    spec = grpo(environment={"factory": "my_env:Vault", "args": {"secret": "x"}}, rewards=[])
    assert spec.environment.factory == "my_env:Vault" and spec.rewards == []
    named = grpo(environment={"a": {"factory": "my_env:Vault"}, "b": {"factory": "my_env:Vault"}})
    assert set(named.environment) == {"a", "b"}
    assert problems(environment={"factory": "Vault"}) == (
        "environment.factory: expected module:Class (e.g. my_env:Game); got 'Vault'"
    )
    assert problems(rewards=[]) == "rewards: give at least one reward (function, builtin or model)"
    assert problems(environment={"factory": "my_env:Vault", "arg": {}}) == (
        "environment.arg: unknown key; did you mean environment.args?"
    )
    assert problems(environment={"a": {"factory": "my_env:Vault", "arg": {}}}) == (
        "environment.a.arg: unknown key; did you mean environment.a.args?"
    )
    training = {**load_template("grpo/tiny.yaml")["training"], "max_tool_calling_iterations": 3}
    grpo(training=training, environment={"factory": "my_env:Vault"})
    assert problems(training={**training, "remove_unused_columns": True}, environment={"factory": "my_env:Vault"}) == (
        "training.remove_unused_columns: true leaves each row its prompt alone, and the environment reads the whole "
        "row (reset(**row); several environments, its environment column); set it false"
    )


def test_each_environment_is_built_once_and_checked_as_the_model_will_use_it(tool_module: str) -> None:
    def source(name: str, **args: Any) -> EnvironmentSource:
        return EnvironmentSource(factory=f"{tool_module}:{name}", args=args)

    factory = resolve_environment(source("Vault", secret="blue"), scored=False)
    assert factory().open("1234") == "blue"
    several = resolve_environment({"a": source("Vault"), "b": source("Unscored")}, scored=False)
    assert sorted(several) == ["a", "b"]

    def refusal(environment: Any, scored: bool = True) -> str:
        with pytest.raises(SpecError) as error:
            resolve_environment(environment, scored)
        return str(error.value)

    assert refusal(source("Broken")) == (
        "environment: building some_tools:Broken raised RuntimeError: no vault server at vault:8200"
    )
    assert refusal({"v": source("Resetless")}) == (
        "environment.v.factory: some_tools:Resetless has no reset method, which starts each rollout (reset(**row))"
    )
    assert refusal(source("Undocumented")).startswith(
        "environment.factory: some_tools:Undocumented.shout: Cannot generate JSON schema for shout because it has "
        "no docstring!"
    )
    assert refusal(source("Unscored"), scored=False) == (
        "rewards: none given, and no environment has a get_reward method to score its rollouts; give a reward, or "
        "add get_reward"
    )
    resolve_environment(source("Mute"), scored=False)


def test_several_environments_need_a_column_naming_each_rows() -> None:
    environments = {"a": None, "b": None}
    check_environment_column(environments, [("data.train", Dataset.from_list([{"environment": "a"}]))])
    with pytest.raises(SpecError) as error:
        check_environment_column(environments, [("data.train", Dataset.from_list([{"prompt": "x"}]))])
    assert str(error.value) == (
        "data.train: several environments (a, b) need an environment column naming each row's; add it, or give one "
        "environment"
    )
    with pytest.raises(SpecError, match="data.train: column environment names 'c', which the spec's environment"):
        check_environment_column(environments, [("data.train", Dataset.from_list([{"environment": "c"}]))])


def test_the_calculator_template_gives_a_tool_the_model_can_read_and_answers_it_can_reach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """templates/grpo/qwen2.5-0.5b-calculator.yaml: its tool imports as the job imports it (posttrain.templates.tools), and
    each problem's answer is what the calculator computes from the problem's numbers, which math_verify accepts."""
    import re

    from helpers import REPO
    from posttrain.components.spec.rewards import builtin_reward

    monkeypatch.chdir(REPO)
    spec = validate(load_template("grpo/qwen2.5-0.5b-calculator.yaml"))
    [calculate] = resolve_tools(spec.tools)
    assert calculate("12 * (3 + 4) - 5 / 2") == "81.5"
    for mistake in ("__import__('os')", "2 ** 100", "1 / 0"):
        with pytest.raises((ValueError, ZeroDivisionError)):
            calculate(mistake)
    rows = [json.loads(line) for line in (REPO / spec.data.train.path).read_text().splitlines()]
    reward = builtin_reward("math_verify", {"column": "answer"})
    for row in rows[:20]:
        packs, each, sold = re.findall(r"\d+", row["prompt"][0]["content"])
        assert calculate(f"{packs} * {each} - {sold}") == row["answer"]
        assert reward([[{"role": "assistant", "content": row["answer"]}]], answer=[row["answer"]]) == [1.0]


def test_the_tiny_tools_chain_demonstrates_the_tool_its_grpo_stage_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """templates/chain/tools-tiny.yaml: the SFT demonstrations show the model the room's peek exactly as the GRPO
    stage's environment exposes it; about a third peek, each answering the result as the room serves it, the rest
    guess a digit (what GRPO starts from)."""
    from transformers.utils import get_json_schema

    from helpers import REPO

    monkeypatch.chdir(REPO)
    grpo = validate(load_template("grpo/tiny-tools.yaml"))
    room = resolve_environment(grpo.environment, scored=True)()
    sft = validate(load_template("sft/tiny-tools.yaml"))
    demos = [json.loads(line) for line in (REPO / sft.data.train.path).read_text().splitlines()]
    questions = [json.loads(line) for line in (REPO / grpo.data.train.path).read_text().splitlines()]
    assert {demo["prompt"][0]["content"] for demo in demos} == {row["prompt"][0]["content"] for row in questions}
    peeking = [demo for demo in demos if len(demo["completion"]) > 1]
    assert 0.2 < len(peeking) / len(demos) < 0.4
    for demo in demos:
        assert demo["tools"] == [get_json_schema(room.peek)]
        *exchange, answer = demo["completion"]
        assert answer["content"] in set("0123456789")
        if exchange:
            call, result = exchange
            room.reset(**{**demo, "answer": answer["content"]})
            assert call["tool_calls"][0]["function"]["name"] == "peek" and result["content"] == room.peek()


def test_the_tool_use_chain_demonstrates_the_tools_its_grpo_stages_give(monkeypatch: pytest.MonkeyPatch) -> None:
    """templates/chain/tool-use-tiny.yaml: the demonstrations show each task's tools as its environment exposes
    them, make the calls in about a third of the cases (what GRPO starts from), and the calls they make are those
    that earn the environment's reward."""
    from transformers.utils import get_json_schema

    from helpers import REPO

    monkeypatch.chdir(REPO)
    chain = load_template("chain/tool-use-tiny.yaml")["stages"]
    demos = [json.loads(line) for line in (REPO / chain["sft"]["data"]["train"]["path"]).read_text().splitlines()]
    assert 0.2 < sum(len(demo["completion"]) > 1 for demo in demos) / len(demos) < 0.4
    for stage in ("lamp", "safe"):
        environment = resolve_environment(EnvironmentSource(**chain[stage]["environment"]), scored=False)()
        requests = (REPO / chain[stage]["data"]["train"]["path"]).read_text().splitlines()
        [request] = {json.loads(line)["prompt"][0]["content"] for line in requests}
        for demo in (demo for demo in demos if demo["prompt"][0]["content"] == request):
            calls = [m["tool_calls"][0]["function"]["name"] for m in demo["completion"] if "tool_calls" in m]
            assert demo["tools"] == [
                get_json_schema(getattr(environment, tool["function"]["name"])) for tool in demo["tools"]
            ]
            environment.reset()
            results = [getattr(environment, call)() for call in calls]
            assert results == [m["content"] for m in demo["completion"] if m["role"] == "tool"]
            assert environment.get_reward() == float(bool(calls))
