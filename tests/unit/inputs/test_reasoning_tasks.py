"""reasoning-gym's tasks as a data source (``data: {train: {reasoning_gym: ...}}``) and the built-in reward that
scores them: the rows are reasoning-gym's own, the same from a seed wherever they are made, and every score is the
task's own ``score_answer`` of what the completion wrote in its tags."""

import json
import os
import subprocess
import sys
from typing import Any, Dict, List

import pytest
import reasoning_gym
from reasoning_gym.composite import DatasetSpec

from helpers import REPO, load_template
from posttrain.components.spec import reasoning_tasks
from posttrain.components.spec.chain import load_chain
from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.registry import SPEC_CLASSES
from posttrain.components.spec.rewards import builtin_reward
from posttrain.entrypoints.inputs.data import load_split
from posttrain.entrypoints.records.fingerprints import split_fingerprint

COUNT_BITS = {"name": "count_bits", "config": {"min_n": 1, "max_n": 15}}
CHAIN_SUM = {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}


def _source(**given: Any) -> Dict[str, Any]:
    return {"reasoning_gym": {"tasks": [COUNT_BITS], "size": 40, "seed": 1, **given}}


def _spec(algorithm: str, train: Dict[str, Any], **data: Any) -> Any:
    raw = load_template(f"{algorithm}/tiny.yaml")
    raw["data"] = {"train": train, **data}
    if "eval" in data:
        raw["training"].update(eval_strategy="steps", eval_steps=10)
    return validate(raw)


def _rows(algorithm: str = "grpo", **given: Any) -> Any:
    spec = _spec(algorithm, _source(**given))
    return load_split(spec.data, SPEC_CLASSES[algorithm].data_formats, "train", seed=0)


@pytest.mark.parametrize(
    "source, data, message",
    [
        (_source(tasks=[]), {}, "data.train.reasoning_gym.tasks: an empty list; name at least one task"),
        (_source(size=0), {}, "data.train.reasoning_gym.size: 0; expected at least 1 row"),
        (_source(wrong_answers=1.0), {}, "data.train.reasoning_gym.wrong_answers: 1.0; expected a share in [0, 1)"),
        (_source(answer_format="<a></a>"), {}, "data.train.reasoning_gym.answer_format: '<a></a>' has no {answer}"),
        (
            _source(tasks=[COUNT_BITS, {**CHAIN_SUM, "weight": 0}]),
            {},
            "data.train.reasoning_gym.tasks.1.weight: 0.0; expected a positive number",
        ),
        (_source(tasks=[COUNT_BITS, COUNT_BITS]), {}, "data.train.reasoning_gym.tasks: 'count_bits' is named twice"),
        (
            _source(tasks=[{"name": "count_bits", "config": {"seed": 3}}]),
            {},
            "data.train.reasoning_gym.tasks.0.config: seed is the source's (data.train.reasoning_gym.seed)",
        ),
        ({**_source(), "split": "test"}, {}, "data.train.split: applies to hub data sets"),
        ({**_source(), "path": "rows.jsonl"}, {}, "data.train: give exactly one of path (a local"),
        (
            _source(),
            # a composite's second task draws from seeds 3 to 10: the training rows of seeds 1 to 40's
            {"eval": _source(tasks=[CHAIN_SUM, COUNT_BITS], size=8)},
            "data.eval.reasoning_gym.seed: 1 draws count_bits rows from seeds data.train trains on (reasoning-gym "
            "draws a task's row k from its seed + k): held-out rows need seeds of their own, e.g. "
            "data.eval.reasoning_gym.seed: 41",
        ),
    ],
)
def test_a_source_that_cannot_generate_is_one_line_at_submit(source: Any, data: dict, message: str) -> None:
    with pytest.raises(SpecError) as error:
        _spec("sft", source, **data)
    assert len(error.value.problems) == 1 and error.value.problems[0].startswith(message), error.value.problems


def test_a_training_run_s_evaluation_on_its_training_rows_seeds_is_refused_and_later_seeds_taken() -> None:
    raw = load_template("grpo/tiny.yaml")
    raw["data"] = {"train": _source()}
    raw["evaluate"] = {"rewards": [{"builtin": "reasoning_gym"}]}
    # row k of seed 40 is row k + 39 of seed 1: one row shared is the same row
    raw["evaluate"]["data"] = {"eval": _source(seed=40)}
    with pytest.raises(SpecError) as error:
        validate(raw)
    assert error.value.problems == [
        "evaluate.data.eval.reasoning_gym.seed: 40 draws count_bits rows from seeds data.train trains on "
        "(reasoning-gym draws a task's row k from its seed + k): held-out rows need seeds of their own, e.g. "
        "evaluate.data.eval.reasoning_gym.seed: 41"
    ]
    raw["evaluate"]["data"]["eval"] = _source(seed=41)
    assert validate(raw).evaluate is not None
    trained = {entry["question"] for entry in reasoning_gym.create_dataset("count_bits", size=40, seed=1, max_n=15)}
    shifted = reasoning_gym.create_dataset("count_bits", size=40, seed=40, max_n=15)
    assert shifted[0]["question"] in trained


def test_unknown_tasks_and_refused_configs_are_a_line_each_in_the_job_before_anything_loads() -> None:
    tasks = [{"name": "count_bit"}, {"name": "chain_sum", "config": {"min_terms": 3, "max_terms": 2}}]
    tasks.append({"name": "products", "config": {"digits": 2}})
    with pytest.raises(SpecError) as error:
        _rows(tasks=tasks)
    assert error.value.problems == [
        "data.train.reasoning_gym.tasks.0.name: reasoning-gym has no task 'count_bit'; did you mean count_bits?",
        "data.train.reasoning_gym.tasks.1.config: chain_sum refuses it: max_terms must be >= min_terms",
        "data.train.reasoning_gym.tasks.2.config: products refuses it: ProductsConfig.__init__() got an unexpected "
        "keyword argument 'digits'",
    ]


def test_the_rows_are_reasoning_gym_s_own_as_chat_prompts_with_their_answers() -> None:
    rows = _rows("sft", system="Answer in tags.")
    own = reasoning_gym.create_dataset("count_bits", size=40, seed=1, min_n=1, max_n=15)
    assert rows.column_names == ["prompt", "answer", "completion", "reasoning_gym"] and len(rows) == 40
    for row, entry in zip(rows, own):
        assert row["prompt"] == [
            {"role": "system", "content": "Answer in tags."},
            {"role": "user", "content": entry["question"]},
        ]
        assert row["answer"] == entry["answer"]
        assert row["completion"] == [{"role": "assistant", "content": f"<answer>{entry['answer']}</answer>"}]
    # no system message given: reasoning-gym's, which asks for the tags the scorer reads
    default = _rows()[0]["prompt"][0]["content"]
    assert default == reasoning_gym.utils.SYSTEM_PROMPTS["default"] and "<answer>" in default


def test_a_share_of_completions_give_another_row_s_answer_and_the_rest_their_own() -> None:
    rows = _rows("sft", size=400, wrong_answers=0.4, answer_format="The answer is {answer}.")
    given = [row["completion"][0]["content"].removeprefix("The answer is ").removesuffix(".") for row in rows]
    wrong = [answer for answer, row in zip(given, rows) if answer != row["answer"]]
    assert 0.3 < len(wrong) / len(rows) < 0.5
    assert set(wrong) <= set(rows["answer"])
    assert given == [
        row["completion"][0]["content"].removeprefix("The answer is ").removesuffix(".")
        for row in _rows("sft", size=400, wrong_answers=0.4, answer_format="The answer is {answer}.")
    ]


def _completions(rows: Any) -> List[List[Dict[str, str]]]:
    """Answers of every kind for the rows in turn: right, wrong, off by a sign, untagged, no answer, and a tagged
    answer after an earlier tag."""
    texts = []
    for index, row in enumerate(rows):
        answer = row["answer"]
        texts.append(
            [
                f"<answer>{answer}</answer>",
                f"<answer>{int(answer) + 1}</answer>",
                f"<answer>-{answer}</answer>",
                answer,
                "",
                f"<answer>0</answer> no: <answer> {answer} </answer>",
            ][index % 6]
        )
    return [[{"role": "assistant", "content": text}] for text in texts]


def test_the_scorer_is_the_task_s_own_score_answer_of_what_the_tags_hold() -> None:
    mixture = [{**CHAIN_SUM, "weight": 2.0}, COUNT_BITS]
    rows = _rows(tasks=mixture, size=60)
    composite = reasoning_gym.create_dataset(
        "composite",
        size=60,
        seed=1,
        datasets=[
            DatasetSpec(name=task["name"], weight=task.get("weight", 1.0), config=task["config"]) for task in mixture
        ],
    )
    completions = _completions(rows)
    logged: Dict[str, List[str]] = {}
    scorer = builtin_reward("reasoning_gym", {})
    assert scorer.__name__ == "reasoning_gym"
    scores = scorer(completions, log_extra=logged.__setitem__, **{column: rows[column] for column in rows.column_names})
    extracted = logged["reasoning_gym/answer"]
    by_hand = [composite.score_answer(answer or None, entry=composite[index]) for index, answer in enumerate(extracted)]
    assert scores == by_hand
    assert extracted[:6] == [
        rows[0]["answer"],
        str(int(rows[1]["answer"]) + 1),
        f"-{rows[2]['answer']}",
        "",
        "",
        rows[5]["answer"],
    ]
    # both tasks drawn, each scoring its own; partial credit where reasoning-gym gives it (a longer answer holding the
    # right one)
    assert {entry["metadata"]["source_dataset"] for entry in composite} == {"chain_sum", "count_bits"}
    assert {1.0, 0.0} <= set(scores) and any(0 < score < 1 for score in scores)
    # the last line, where the prompt asks for no tags
    last_line = builtin_reward("reasoning_gym", {"pattern": None})
    plain = [[{"role": "assistant", "content": f"so:\n{row['answer']}\n"}] for row in rows]
    assert last_line(plain, reasoning_gym=rows["reasoning_gym"]) == [1.0] * len(rows)


def test_rows_are_the_same_in_any_process_and_known_by_their_generation() -> None:
    """Rows made in two processes with other hash seeds and ranks equal this one's; the data's fingerprint (a
    finished run's record of what it trained on) is the generation, and changes with it."""
    spec = _spec("grpo", _source(tasks=[CHAIN_SUM, COUNT_BITS], size=50))
    here = load_split(spec.data, SPEC_CLASSES["grpo"].data_formats, "train", seed=0).to_list()
    program = (
        "import json, sys; from posttrain.components.spec.sections import DataSpec; "
        "from posttrain.entrypoints.inputs.data import load_split; "
        "data = DataSpec.model_validate(json.loads(sys.argv[1])); "
        "print(json.dumps(load_split(data, [('prompt',)], 'train', seed=0).to_list()))"
    )
    for rank, hash_seed in (("0", "1"), ("1", "2")):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "RANK": rank, "WORLD_SIZE": "2"}
        there = subprocess.run(
            [sys.executable, "-c", program, spec.data.model_dump_json()],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(there.stdout) == here
    fingerprint = split_fingerprint(spec.data, "train", None)
    assert fingerprint["source"] == "reasoning_gym"
    other = _spec("grpo", _source(tasks=[CHAIN_SUM, COUNT_BITS], size=50, seed=2))
    assert split_fingerprint(other.data, "train", None) != fingerprint


def test_without_reasoning_gym_the_job_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    reasoning_tasks.generated.cache_clear()
    with pytest.raises(SpecError) as error:
        _rows()
    assert error.value.problems == [
        "data.train.reasoning_gym: needs reasoning-gym, which the job's environment lacks: "
        "pip install 'posttrain[tasks]'"
    ]
    with pytest.raises(SpecError) as error:
        builtin_reward("reasoning_gym", {})
    assert error.value.problems[0].endswith("lacks: pip install 'posttrain[tasks]'")


def test_a_chain_s_gate_on_rows_an_earlier_stage_trained_on_is_refused_at_submit() -> None:
    chain = "templates/chain/reasoning-tiny.yaml"
    assert [stage.name for stage in load_chain(str(REPO / chain)).stages] == ["sft", "grpo", "check"]
    with pytest.raises(SpecError) as error:
        load_chain(str(REPO / chain), ["stages.check.data.eval.reasoning_gym.seed=2001"])
    assert error.value.problems == [
        "stages.check.data.eval.reasoning_gym.seed: 2001 draws gcd rows from seeds stages.grpo.data.train trains "
        "on (reasoning-gym draws a task's row k from its seed + k): held-out rows need seeds of their own, e.g. "
        "stages.check.data.eval.reasoning_gym.seed: 2002"
    ]
    # a later training stage's own held-out rows (clear of its own training's seeds), against SFT's training
    with pytest.raises(SpecError) as error:
        load_chain(
            str(REPO / chain),
            [
                "stages.grpo.data.train.reasoning_gym.seed=5000",
                "stages.grpo.evaluate.data.eval.reasoning_gym.tasks=[{name: gcd}]",
                "stages.grpo.evaluate.data.eval.reasoning_gym.size=8",
                "stages.grpo.evaluate.data.eval.reasoning_gym.seed=1",
                "stages.grpo.evaluate.rewards=[{builtin: reasoning_gym}]",
            ],
        )
    assert error.value.problems == [
        "stages.grpo.evaluate.data.eval.reasoning_gym.seed: 1 draws gcd rows from seeds stages.sft.data.train trains "
        "on (reasoning-gym draws a task's row k from its seed + k): held-out rows need seeds of their own, e.g. "
        "stages.grpo.evaluate.data.eval.reasoning_gym.seed: 2001"
    ]


def test_tasks_without_one_answer_have_no_completion_and_wrong_answers_stay_within_their_task() -> None:
    # graph_color's answer is None: score_answer judges the model's colouring
    rows = _rows(tasks=[{"name": "graph_color"}], size=4)
    assert rows["answer"] == [None] * 4 and rows["completion"] == [None] * 4
    with pytest.raises(SpecError) as error:
        _rows(tasks=[{"name": "graph_color"}], size=4, wrong_answers=0.3)
    assert error.value.problems == [
        "data.train.reasoning_gym.wrong_answers: graph_color gives its rows no answer to write (its score_answer "
        "judges the model's own), so no row can be given another; drop wrong_answers, or give the task another config"
    ]
    with pytest.raises(SpecError) as error:
        _rows(tasks=[{"name": "composite"}])
    assert error.value.problems == [
        "data.train.reasoning_gym.tasks.0.name: composite is reasoning-gym's mix of tasks; list them instead"
    ]
    # a gcd row given a wrong answer gets another gcd answer, never a word of spell_backward's
    mixed = _rows("sft", tasks=[COUNT_BITS, {"name": "spell_backward"}], size=200, wrong_answers=0.5)
    for row in mixed:
        written = row["completion"][0]["content"].removeprefix("<answer>").removesuffix("</answer>")
        assert written.isdigit() == row["answer"].isdigit(), row


def test_strict_scores_only_the_right_answer_and_the_fingerprint_is_the_whole_source() -> None:
    rows = _rows(tasks=[CHAIN_SUM], size=20)
    right = next(row for row in rows if row["answer"] == "4")
    inside = [[{"role": "assistant", "content": "<answer>14</answer>"}]]
    loose, strict = (builtin_reward("reasoning_gym", {"strict": flag}) for flag in (False, True))
    # reasoning-gym's default pays an answer that holds the right one
    assert loose(inside, reasoning_gym=[right["reasoning_gym"]]) == [0.5]
    assert strict(inside, reasoning_gym=[right["reasoning_gym"]]) == [0.0]
    fingerprints = [
        split_fingerprint(_spec("sft", _source(**given)).data, "train", None)
        for given in ({}, {"wrong_answers": 0.2}, {"system": "Be brief."})
    ]
    assert len({json.dumps(fingerprint, sort_keys=True) for fingerprint in fingerprints}) == 3
    assert fingerprints[0]["reasoning_gym"] == "0.1.25"


def test_generated_sources_mix_as_any_sources_do() -> None:
    """Two generated sources interleaved by weight (data.mix): every row keeps the key its scorer reads, and
    scores as its own task's."""
    spec = _spec(
        "grpo",
        [
            {**_source(), "weight": 3.0},
            {"reasoning_gym": {"tasks": [CHAIN_SUM], "size": 40, "seed": 5}, "weight": 1.0},
        ],
        mix="interleave",
    )
    rows = load_split(spec.data, SPEC_CLASSES["grpo"].data_formats, "train", seed=0)
    assert len(rows) > 80 and set(rows.column_names) == {"prompt", "answer", "completion", "reasoning_gym"}
    right = [[{"role": "assistant", "content": f"<answer>{answer}</answer>"}] for answer in rows["answer"]]
    assert builtin_reward("reasoning_gym", {})(right, reasoning_gym=rows["reasoning_gym"]) == [1.0] * len(rows)
    tasks = {json.loads(key)["tasks"][0]["name"] for key in rows["reasoning_gym"]}
    assert tasks == {"count_bits", "chain_sum"}
