"""reasoning-gym's generators as posttrain uses them, in one place: a ``reasoning_gym`` data source's rows and the
built-in reward ``reasoning_gym`` that scores them are made by the same generation, so they agree by construction.

Each generated row carries, in its ``reasoning_gym`` column, its generation and its index in it
(:func:`row_key`); the scorer regenerates that data set (cached) and asks the row's entry of the task's own
``score_answer``. reasoning-gym (``pip install 'posttrain[tasks]'``) is imported only in a job that uses it; the
client checks the source's shape alone (``data_sources.py``), since what is installed where the job runs is the
job's to say.
"""

import difflib
import functools
import json
from typing import Any, List, Optional

from posttrain.components.spec.messages import SpecError, first_line

INSTALL = "pip install 'posttrain[tasks]'"
# the column of a generated row that says which row of which generation it is
KEY_COLUMN = "reasoning_gym"


def imported(where: str) -> Any:
    """The ``reasoning_gym`` package, or one line naming ``where`` and the install command."""
    try:
        import reasoning_gym
    except ImportError:
        raise SpecError([f"{where}: needs reasoning-gym, which the job's environment lacks: {INSTALL}"]) from None
    return reasoning_gym


def task_problems(tasks: Any, where: str) -> List[str]:
    """Each task of a ``reasoning_gym`` source (``sections.ReasoningTasks``) that reasoning-gym does not have, or
    whose config its task refuses, one line each."""
    imported(where)
    from reasoning_gym.factory import DATASETS

    found = []
    for index, task in enumerate(tasks.tasks):
        if task.name == "composite":
            found.append(f"{where}.tasks.{index}.name: composite is reasoning-gym's mix of tasks; list them instead")
            continue
        if task.name not in DATASETS:
            close = difflib.get_close_matches(task.name, DATASETS, n=1)
            hint = (
                f"; did you mean {close[0]}?"
                if close
                else " (python -c 'import reasoning_gym; print(sorted(reasoning_gym.factory.DATASETS))' lists them)"
            )
            found.append(f"{where}.tasks.{index}.name: reasoning-gym has no task {task.name!r}{hint}")
            continue
        config_class = DATASETS[task.name][1]
        try:
            config = config_class(**task.config, size=tasks.size, seed=tasks.seed)
            if hasattr(config, "validate"):
                config.validate()
        # a dataclass's own TypeError for an unknown field, validate()'s assertions, or whatever a task raises
        except Exception as error:  # noqa: BLE001 -- every refusal is the config's
            found.append(
                f"{where}.tasks.{index}.config: {task.name} refuses it: {first_line(error) or type(error).__name__}"
            )
    return found


def generation_key(tasks: Any) -> str:
    """What decides a source's rows (its tasks, size and seed), as JSON: equal keys, equal rows."""
    return json.dumps(
        {"tasks": [task.model_dump() for task in tasks.tasks], "size": tasks.size, "seed": tasks.seed}, sort_keys=True
    )


def row_key(generation: str, index: int) -> str:
    """A generated row's ``reasoning_gym`` column: its generation (:func:`generation_key`) and its index in it."""
    return json.dumps({**json.loads(generation), "index": index}, sort_keys=True)


@functools.lru_cache(maxsize=16)
def generated(generation: str) -> Any:
    """reasoning-gym's data set for a :func:`generation_key`: the task's own for one task, its composite (drawn by
    weight) for several."""
    reasoning_gym = imported("reasoning_gym")
    given = json.loads(generation)
    tasks, size, seed = given["tasks"], given["size"], given["seed"]
    if len(tasks) == 1:
        return reasoning_gym.create_dataset(tasks[0]["name"], size=size, seed=seed, **tasks[0]["config"])
    from reasoning_gym.composite import DatasetSpec

    specs = [DatasetSpec(name=task["name"], weight=task["weight"], config=dict(task["config"])) for task in tasks]
    return reasoning_gym.create_dataset("composite", size=size, seed=seed, datasets=specs)


@functools.lru_cache(maxsize=65536)
def _entry(key: str) -> Any:
    """The data set and the entry of the row a :func:`row_key` names: made once for a row's many completions."""
    given = json.loads(key)
    index = given.pop("index")
    dataset = generated(json.dumps(given, sort_keys=True))
    return dataset, dataset[index]


def score(answer: Optional[str], key: str) -> float:
    """The task's own ``score_answer`` of ``answer`` (None: none found) for the row a :func:`row_key` names."""
    dataset, entry = _entry(key)
    return float(dataset.score_answer(answer, entry=entry))
