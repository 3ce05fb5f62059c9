"""verifiers environments (verifiers 0.4.0's ``verifiers.v1``) as the job loads them: a taskset by its id and
config, with the harness posttrain plays its tasks with, and the taskset's tasks as a data set.

The harness is verifiers' ``null`` one in the ``subprocess`` runtime: a chat
program in a local process per episode, started through ``uv`` (which
prepares its script's environment from the package index, once per
machine), that calls the model and the taskset's tools (served over MCP) until
the model answers without a call. Each row is a task: ``prompt``, its chat
(its system prompt first, where it has one), and ``verifiers_task``, its index
in the taskset, by which its episode finds it.
"""

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Dict, List

from posttrain.components.spec.messages import SpecError, first_line
from posttrain.components.spec.sections import VerifiersTaskset

KEY_COLUMN = "verifiers_task"
INSTALL = "pip install 'posttrain[verifiers]'"
HARNESS = {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}


def imported(where: str) -> Any:
    """``verifiers.v1``, or one line naming ``where`` and the install command."""
    try:
        import verifiers.v1 as vf
    except ImportError:
        raise SpecError([f"{where}: needs verifiers, which the job's environment lacks: {INSTALL}"]) from None
    return vf


# each taskset loaded once per process: the rows of its data and the tasks its episodes play are one load's
_LOADED: Dict[str, Any] = {}


def load_environment(taskset: VerifiersTaskset, where: str) -> Any:
    """The environment of ``taskset``, played by :data:`HARNESS`; an id verifiers cannot resolve, or a config its
    taskset refuses, in one line naming ``where``."""
    key = taskset.model_dump_json()
    if key not in _LOADED:
        _LOADED[key] = _loaded(taskset, where)
    return _LOADED[key]


def _loaded(taskset: VerifiersTaskset, where: str) -> Any:
    vf = imported(where)
    try:
        config = vf.resolve_env_config({"taskset": {"id": verifiers_id(taskset.id), **taskset.args}, "agent": HARNESS})
        environment = vf.load_environment(config)
    except Exception as error:  # noqa: BLE001 -- the taskset's own code: its failure is the user's to read
        raise SpecError(
            [
                f"{where}: verifiers cannot load the taskset {taskset.id!r} with args {taskset.args}: "
                f"{first_line(error)} (an id is an installed package, or a module the job can import)"
            ]
        ) from None
    _importable_by_tool_servers(type(environment.taskset).__module__)
    return environment


def _importable_by_tool_servers(module_name: str) -> None:
    """The folder the taskset's module is imported from, on PYTHONPATH: verifiers serves a taskset's tools from a
    process of its own, which imports their module by name, and the job's working directory (where a local
    taskset is) is on the job's path, not on that process's (without it, every tool call of an episode hangs)."""
    file = getattr(sys.modules[module_name], "__file__", None)
    if file is None:
        return
    path = Path(file).resolve()
    root = path.parents[module_name.count(".") + (path.name == "__init__.py")]
    # a module found where its name says (not an editable install's mapping)
    if not (root / module_name.partition(".")[0]).exists() and not (root / f"{module_name}.py").is_file():
        return
    paths = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    if str(root) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(paths + [str(root)])


def verifiers_id(taskset_id: str) -> str:
    """The id verifiers resolves for ``taskset_id``: itself, or for a module path (``pkg.tasks.mine``, which
    verifiers 0.4.0 does not import: it takes top-level names), the module's own name, under which it is imported."""
    if "." not in taskset_id or "/" in taskset_id or importlib.util.find_spec(taskset_id.partition(".")[0]) is None:
        return taskset_id
    module = importlib.import_module(taskset_id)
    name = taskset_id.rpartition(".")[2]
    if sys.modules.setdefault(name, module) is not module:
        raise SpecError([f"{taskset_id}: another module named {name} is imported; rename the taskset's module"])
    return name


def taskset_module(taskset_id: str) -> str:
    """The module verifiers imports for ``taskset_id``."""
    # verifiers is an extra: imported by a job that plays its environments only
    from verifiers.v1.utils.loaders import import_taskset

    return import_taskset(verifiers_id(taskset_id)).__name__


def taskset_rows(taskset: VerifiersTaskset, where: str) -> Any:
    """The taskset's tasks as a ``datasets.Dataset`` of :func:`row`\\ s."""
    import datasets

    environment = load_environment(taskset, where)
    if not environment.taskset.bounded:
        raise SpecError([f"{where}: the taskset {taskset.id!r} never ends; bound it (its args: a number of tasks)"])
    return datasets.Dataset.from_list([row(task.data) for task in environment.taskset])


def row(data: Any) -> Dict[str, Any]:
    """A task's row: its chat as messages of text, and its index."""
    return {"prompt": _messages(data.system_prompt, data.prompt), KEY_COLUMN: data.idx}


def _messages(system: Any, prompt: Any) -> List[Dict[str, str]]:
    said = [{"role": "system", "content": system}] if system else []
    if isinstance(prompt, str):
        return said + [{"role": "user", "content": prompt}]
    for message in prompt or []:
        message = message if isinstance(message, dict) else message.model_dump()
        content = message.get("content") or ""
        # a message of parts: its text parts, as the row's text
        if not isinstance(content, str):
            content = "".join(part.get("text") or "" for part in content if isinstance(part, dict))
        said.append({"role": message["role"], "content": content})
    return said
