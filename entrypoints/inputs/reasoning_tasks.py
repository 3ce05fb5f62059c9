"""A ``reasoning_gym`` data source's rows: reasoning-gym's generation (``components/spec/reasoning_tasks.py``) as a
data set every algorithm reads.

Each row: ``prompt``, the chat the task is asked in (the source's ``system`` message, else reasoning-gym's own,
then the question as the user's); ``answer``, the task's (None for a task with no one answer, graph_color's);
``completion``, the model's turn that answers it as ``answer_format`` writes it (SFT's warm-start; None without an
answer), in a share ``wrong_answers`` of the rows with another answer of its task's instead; and ``reasoning_gym``,
which row of which generation it is, for the scorer. Generated from the seed alone:
the same rows on every rank, on every rerun, on any number of processes.
"""

import random
from typing import Any, Dict, List, Optional, Set

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
    # a task with no one answer (graph_color's: any valid colouring) has None: its score_answer checks the model's
    answers = [None if entry["answer"] is None else str(entry["answer"]) for entry in entries]
    given = _given_answers(
        answers, [entry["metadata"].get("source_dataset", tasks.tasks[0].name) for entry in entries], tasks, where
    )
    rows: List[Dict[str, Any]] = [
        {
            "prompt": [{"role": "system", "content": system}, {"role": "user", "content": entry["question"]}],
            "answer": answer,
            "completion": None
            if writes is None
            else [{"role": "assistant", "content": tasks.answer_format.replace("{answer}", writes)}],
            KEY_COLUMN: row_key(generation, index),
        }
        for index, (entry, answer, writes) in enumerate(zip(entries, answers, given))
    ]
    return datasets.Dataset.from_list(rows)


def _given_answers(
    answers: List[Optional[str]], tasks_of_rows: List[str], tasks: ReasoningTasks, where: str
) -> List[Optional[str]]:
    """The answers the completions give: each row's own, but in a share ``wrong_answers`` of them (drawn from the
    seed) another answer its task gives another row, one that differs."""
    if not tasks.wrong_answers:
        return answers
    distinct: Dict[str, Set[str]] = {}
    for answer, task in zip(answers, tasks_of_rows):
        if answer is not None:
            distinct.setdefault(task, set()).add(answer)
    by_task = {task: sorted(answers_of_task) for task, answers_of_task in distinct.items()}
    problems = [
        f"{where}.wrong_answers: {task} gives its rows "
        + ("no answer to write (its score_answer judges the model's own)" if task not in by_task else "one answer")
        + ", so no row can be given another; drop wrong_answers, or give the task another config"
        for task in sorted(set(tasks_of_rows))
        if len(by_task.get(task, [])) < 2
    ]
    if problems:
        raise SpecError(problems)
    draw = random.Random(tasks.seed)
    given = []
    for answer, task in zip(answers, tasks_of_rows):
        if answer is not None and draw.random() < tasks.wrong_answers:
            other = answer
            while other == answer:
                other = draw.choice(by_task[task])
            answer = other
        given.append(answer)
    return given
