"""A ``reasoning_gym`` data source's rows: reasoning-gym's generation (``components/spec/reasoning_tasks.py``) as a
data set every algorithm reads.

Each row: ``prompt``, the chat the task is asked in (the source's ``system`` message, else reasoning-gym's own,
then the question as the user's); ``answer``, the task's; ``completion``, the model's turn that answers it as
``answer_format`` writes it (SFT's warm-start), in a share ``wrong_answers`` of the rows with another row's answer
instead; and ``reasoning_gym``, which row of which generation it is, for the scorer. Generated from the seed alone:
the same rows on every rank, on every rerun, on any number of processes.
"""

import random
from typing import Any, Dict, List

from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.reasoning_tasks import (
    KEY_COLUMN,
    generated,
    generation_key,
    imported,
    row_key,
    task_problems,
)
from posttrain.components.spec.sections import ReasoningTasks


def generated_rows(tasks: ReasoningTasks, where: str) -> Any:
    """The source's rows as a ``datasets.Dataset``; an unknown task, or a config its task refuses, in one line each
    naming it (``data.train.reasoning_gym.tasks.0.name``)."""
    import datasets

    problems = task_problems(tasks, where)
    if problems:
        raise SpecError(problems)
    generation = generation_key(tasks)
    entries = [generated(generation)[index] for index in range(tasks.size)]
    system = tasks.system if tasks.system is not None else imported(where).utils.SYSTEM_PROMPTS["default"]
    answers = _given_answers([entry["answer"] for entry in entries], tasks.wrong_answers, tasks.seed)
    rows: List[Dict[str, Any]] = [
        {
            "prompt": [{"role": "system", "content": system}, {"role": "user", "content": entry["question"]}],
            "answer": entry["answer"],
            "completion": [{"role": "assistant", "content": tasks.answer_format.replace("{answer}", given)}],
            KEY_COLUMN: row_key(generation, index),
        }
        for index, (entry, given) in enumerate(zip(entries, answers))
    ]
    return datasets.Dataset.from_list(rows)


def _given_answers(answers: List[str], wrong_share: float, seed: int) -> List[str]:
    """The answers the completions give: each row's own, but in a share ``wrong_share`` of them (drawn from
    ``seed``) another answer of the data set's, one that differs."""
    draw = random.Random(seed)
    distinct = sorted(set(answers))
    given = []
    for answer in answers:
        if len(distinct) > 1 and draw.random() < wrong_share:
            other = answer
            while other == answer:
                other = draw.choice(distinct)
            answer = other
        given.append(answer)
    return given
