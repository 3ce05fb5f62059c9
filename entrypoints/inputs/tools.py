"""The spec's ``tools`` and ``environment`` in the job: what the model may call while it generates, as TRL's
GRPOTrainer takes them (``tools=``, ``environment_factory=``).

What the model sees of a tool is what transformers makes of the function
(``get_json_schema``): its name, its typed arguments and its docstring's
description of each. TRL builds that only when it renders the first
prompt, after every model has loaded; :func:`resolve_tools` imports and
checks each tool before any model loads, :func:`resolve_environment` each
environment (built once, its methods checked as tools), and
:func:`check_tool_template` that the model's chat template renders tool
calls and that TRL can read them back from what the model writes. Every
call of a tool, and of an environment's methods, is bounded
(``user_code.py``: its ``timeout_s``, no ``sys.exit``).
"""

import functools
import inspect
from typing import Any, Callable, Dict, List, Sequence, Tuple, Union

from posttrain.components.spec.messages import SpecError, first_line
from posttrain.components.spec.sections import EnvironmentSource, ToolSource
from posttrain.entrypoints.inputs.chat_templates import training_template
from posttrain.entrypoints.inputs.models import import_user_function
from posttrain.entrypoints.inputs.user_code import guarded, guarded_environment

# The chat templates TRL reads tool calls back from (trl/chat_template_utils.py, add_response_schema), as a user
# would name them
TOOL_TEMPLATES = "Qwen2.5, Qwen3, Llama 3.1 and 3.2, GLM-4 MoE, gpt-oss, LFM2, Nemotron 3, DeepSeek-R1-Distill"


def resolve_tools(tools: Sequence[ToolSource]) -> List[Callable[..., Any]]:
    """Each tool imported and checked as the model will see it: a plain function, named once, whose docstring
    describes each of its typed arguments (the model reads nothing else of it)."""
    resolved: List[Callable[..., Any]] = []
    for index, tool in enumerate(tools):
        where = f"tools.{index}.function"
        function = import_user_function(tool.function, where)
        # transformers renders functions and bound methods only: a partial or a callable object would fail there
        if not (inspect.isfunction(function) or inspect.ismethod(function)):
            kind = type(function).__name__
            raise SpecError([f"{where}: {tool.function} is a {kind}; a tool is a function (def) with a docstring"])
        _check_schema(function, where)
        same_name = [earlier for earlier, other in enumerate(resolved) if other.__name__ == function.__name__]
        if same_name:
            raise SpecError(
                [
                    f"{where}: {tool.function} is named {function.__name__!r}, as tools.{same_name[0]} is; the model "
                    "calls a tool by its name: rename one"
                ]
            )
        resolved.append(guarded(function, f"tools.{index}", tool.timeout_s))
    return resolved


def _check_schema(function: Callable[..., Any], where: str) -> None:
    """What the model will see of ``function`` can be made: a docstring describing each typed argument."""
    from transformers.utils.chat_template_utils import (
        DocstringParsingException,
        TypeHintParsingException,
        get_json_schema,
    )

    try:
        get_json_schema(function)
    except (DocstringParsingException, TypeHintParsingException) as error:
        raise SpecError([f"{where}: {first_line(error)} (the model sees its docstring and type hints)"]) from None


# an environment's methods that are not the model's tools (TRL's names)
ENVIRONMENT_HOOKS = ("reset", "get_reward")


def resolve_environment(
    environment: Union[EnvironmentSource, Dict[str, EnvironmentSource], None], scored: bool
) -> Union[None, Callable[[], Any], Dict[str, Callable[[], Any]]]:
    """The factory of each environment (its class with its ``args``), as TRL's ``environment_factory`` takes them:
    one, or a dict by name. Each is built once now and checked: a ``reset`` method, and public methods the model can
    read as tools; where no reward is ``scored`` by the spec, one environment's ``get_reward`` must score it."""
    if environment is None:
        return None
    named = environment if isinstance(environment, dict) else {"": environment}
    factories: Dict[str, Callable[[], Any]] = {}
    rewarded = False
    for name, source in named.items():
        where = f"environment.{name}" if name else "environment"
        made = import_user_function(source.factory, f"{where}.factory")
        factory = guarded_environment(functools.partial(made, **source.args), where, source.timeout_s)
        try:
            instance = factory()
        except Exception as error:  # noqa: BLE001 -- the user's class failed while it ran: its error, one line
            kind = type(error).__name__
            raise SpecError([f"{where}: building {source.factory} raised {kind}: {first_line(error)}"]) from None
        # on the class, as TRL lists them: the instance's properties are not evaluated
        methods = dict(inspect.getmembers(type(instance), predicate=inspect.isfunction))
        if "reset" not in methods:
            raise SpecError(
                [f"{where}.factory: {source.factory} has no reset method, which starts each rollout (reset(**row))"]
            )
        for method in sorted(methods):
            if not method.startswith("_") and method not in ENVIRONMENT_HOOKS:
                _check_schema(getattr(instance, method), f"{where}.factory: {source.factory}.{method}")
        rewarded = rewarded or "get_reward" in methods
        factories[name] = factory
    if not scored and not rewarded:
        raise SpecError(
            [
                "rewards: none given, and no environment has a get_reward method to score its rollouts; give a "
                "reward, or add get_reward"
            ]
        )
    return factories[""] if "" in factories else factories


def check_environment_column(environments: Dict[str, Any], datasets: Sequence[Tuple[str, Any]]) -> None:
    """With several environments, each row's ``environment`` column names one of them."""
    for where, dataset in datasets:
        if "environment" not in dataset.column_names:
            raise SpecError(
                [
                    f"{where}: several environments ({', '.join(environments)}) need an environment column naming "
                    "each row's; add it, or give one environment"
                ]
            )
        unknown = sorted(set(dataset["environment"]) - set(environments))
        if unknown:
            raise SpecError(
                [
                    f"{where}: column environment names {unknown[0]!r}, which the spec's environment does not; "
                    f"expected one of {', '.join(environments)}"
                ]
            )


def check_tool_template(tokenizer: Any, name_or_path: str, where: str = "tools") -> None:
    """The model's chat template renders a tool call and its result, and TRL reads the calls back from what the
    model writes (it knows the templates of :data:`TOOL_TEMPLATES`, verbatim); else TRL's trainer raises once
    every model has loaded. ``where``: the spec key the calls come from."""
    import copy

    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    if not supports_tool_calling(tokenizer):
        raise SpecError(
            [
                f"{where}: {name_or_path}'s chat template does not render tool calls and their results; train a "
                f"model whose template does ({TOOL_TEMPLATES})"
            ]
        )
    if getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None):
        return
    try:
        add_response_schema(copy.copy(tokenizer))
    except ValueError:
        raise SpecError(
            [
                f"{where}: TRL reads the model's tool calls back only for the chat templates it knows verbatim "
                f"({TOOL_TEMPLATES}), and {name_or_path}'s is not one of them; train a model with one"
            ]
        ) from None


def check_episode_template(tokenizer: Any, name_or_path: str, where: str) -> None:
    """The model's chat template renders calls, TRL reads them back, and TRL has the template its rollouts were
    rendered with (chat_templates.training_template); ``where``: the spec key that plays episodes (tools or agent)."""
    check_tool_template(tokenizer, name_or_path, where)
    try:
        training_template(tokenizer)
    except ValueError:
        raise SpecError(
            [
                f"{where}: {name_or_path}'s chat template renders a turn differently once later messages follow, and "
                f"TRL has no training version of it to play episodes with; use a model with one ({TOOL_TEMPLATES})"
            ]
        ) from None


def check_tool_data(datasets: Sequence[Tuple[str, Any]]) -> None:
    """Prompts a model answers with tool calls are chat messages: TRL's loop appends the calls and their results
    to the conversation (with a text prompt it fails at the first call)."""
    from trl.data_utils import is_conversational

    for where, dataset in datasets:
        if len(dataset) and not is_conversational(dataset[0]):
            raise SpecError(
                [
                    f"{where}: tools need prompts as chat messages (a list of {{role, content}}), and its prompts "
                    "are text; write each prompt as [{role: user, content: ...}]"
                ]
            )
