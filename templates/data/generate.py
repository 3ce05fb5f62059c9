"""Writes the small data sets the tiny templates train on (deterministic).

    python templates/data/generate.py

Each carries a pattern a tiny model learns in a few dozen steps on CPU.
"""

import json
import random
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

HERE = Path(__file__).parent

CAPITALS = {
    "France": "Paris",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Japan": "Tokyo",
    "Egypt": "Cairo",
}
COLORS = {"sky": "blue", "grass": "green", "sun": "yellow", "sea": "blue", "cherry": "red", "banana": "yellow"}


def _chat(question: str, answer: str) -> Dict[str, List[Dict[str, str]]]:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


def sft_rows(rng: random.Random, count: int) -> Iterable[Dict[str, List[Dict[str, str]]]]:
    """Questions with one fixed answer form each: sums, capitals, colours."""
    for _ in range(count):
        kind = rng.choice(("sum", "capital", "color"))
        if kind == "sum":
            a, b = rng.randint(0, 20), rng.randint(0, 20)
            yield _chat(f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}.")
        elif kind == "capital":
            country = rng.choice(sorted(CAPITALS))
            yield _chat(f"What is the capital of {country}?", f"The capital of {country} is {CAPITALS[country]}.")
        else:
            thing = rng.choice(sorted(COLORS))
            yield _chat(f"What color is the {thing}?", f"The {thing} is {COLORS[thing]}.")


def question_rows(rng: random.Random, count: int) -> Iterable[Dict[str, object]]:
    """Questions of sft_rows' kinds as prompts, each with the word its answer must hold: for evaluations."""
    for row in sft_rows(rng, count):
        question, answer = (message["content"] for message in row["messages"])
        yield {"prompt": [{"role": "user", "content": question}], "answer": answer.rstrip(".").split()[-1]}


REFUSALS = ("I do not know.", "No.", "Ask someone else.", "Why would I tell you?", "That is not my problem.")


def _question_and_answer(rng: random.Random) -> Tuple[str, str]:
    row = next(iter(sft_rows(rng, 1)))["messages"]
    return row[0]["content"], row[1]["content"]


def preference_rows(rng: random.Random, count: int) -> Iterable[Dict[str, List[Dict[str, str]]]]:
    """Pairs whose chosen answer follows the rule (answer in full) and rejected one refuses."""
    for _ in range(count):
        question, answer = _question_and_answer(rng)
        yield {
            "prompt": [{"role": "user", "content": question}],
            "chosen": [{"role": "assistant", "content": answer}],
            "rejected": [{"role": "assistant", "content": rng.choice(REFUSALS)}],
        }


def unpaired_rows(rng: random.Random, count: int) -> Iterable[Dict[str, object]]:
    """KTO's unpaired form of the same signal: good answers labelled true, refusals false."""
    for index in range(count):
        question, answer = _question_and_answer(rng)
        desirable = index % 2 == 0
        yield {
            "prompt": [{"role": "user", "content": question}],
            "completion": [{"role": "assistant", "content": answer if desirable else rng.choice(REFUSALS)}],
            "label": desirable,
        }


TOPICS = ("the sky", "the sea", "a color", "your day", "the city", "an apple", "the sun", "a country", "the grass")


def prompt_rows(rng: random.Random, count: int) -> Iterable[Dict[str, List[Dict[str, str]]]]:
    """Open prompts for online RL: the reward, not the data, says what is good."""
    for _ in range(count):
        verb = rng.choice(("Tell me about", "Say something about", "Describe", "Write a line about"))
        yield {"prompt": [{"role": "user", "content": f"{verb} {rng.choice(TOPICS)}."}]}


GOODS = ("apples", "rolls", "books", "pencils", "boxes", "tickets", "eggs", "cards")


def word_problem_rows(rng: random.Random, count: int) -> Iterable[Dict[str, object]]:
    """GSM8K-shaped arithmetic word problems as chat prompts, each answer a number: for a model with a calculator
    (templates/tools/calculator.py)."""
    for _ in range(count):
        goods, packs, each, sold = rng.choice(GOODS), rng.randint(12, 99), rng.randint(6, 48), rng.randint(10, 400)
        question = (
            f"A shop receives {packs} crates with {each} {goods} in each, and sells {sold} {goods}. How many {goods} "
            "does it have left? Give the number alone as your final answer."
        )
        yield {"prompt": [{"role": "user", "content": question}], "answer": str(packs * each - sold)}


HIDDEN_VALUE_QUESTION = "What is the value hidden in the room?"


def _tool_without_arguments(name: str, description: str) -> Dict[str, object]:
    """A tool that takes no arguments and returns text, as the model sees it (transformers' get_json_schema)."""
    parameters = {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters, "return": {"type": "string"}},
    }


# templates/tools/hidden_value.py's Room.peek (a test holds them equal)
PEEK = _tool_without_arguments("peek", "The value hidden in this room.")


def hidden_value_rows(rng: random.Random, count: int) -> Iterable[Dict[str, object]]:
    """Rooms hiding a random digit each (templates/tools/hidden_value.py), for GRPO with the room as environment."""
    for _ in range(count):
        yield {"prompt": [{"role": "user", "content": HIDDEN_VALUE_QUESTION}], "answer": str(rng.randint(0, 9))}


def peek_demo_rows(rng: random.Random, count: int, calls: float) -> Iterable[Dict[str, object]]:
    """Demonstrations for SFT: a ``calls`` share peek, read the value and answer with it; the rest guess a digit
    (right one time in ten). GRPO with the room then learns to peek: only a read value is reliably right."""
    for row in hidden_value_rows(rng, count):
        completion: List[Dict[str, object]] = [{"role": "assistant", "content": str(rng.randint(0, 9))}]
        if rng.random() < calls:
            call = {"type": "function", "function": {"name": "peek", "arguments": {}}}
            completion = [
                {"role": "assistant", "tool_calls": [call]},
                {"role": "tool", "name": "peek", "content": row["answer"]},
                {"role": "assistant", "content": row["answer"]},
            ]
        yield {"prompt": row["prompt"], "completion": completion, "tools": [PEEK]}


# each task: the request, the tools the model sees (templates/tools/lamp.py's and safe.py's, as get_json_schema writes
# them; a test holds them equal) and the calls, with their results, that do it
TOOL_USE_TASKS = {
    "lamp": (
        "Please turn on the lamp.",
        [_tool_without_arguments("switch_on", "Switches the lamp on.")],
        [("switch_on", "The lamp is on.")],
    ),
    "safe": (
        "Please open the safe.",
        [
            _tool_without_arguments("unlock", "Unlocks the safe."),
            _tool_without_arguments("open_door", "Opens the safe's door, once it is unlocked."),
        ],
        [("unlock", "The safe is unlocked."), ("open_door", "The door is open.")],
    ),
}


def tool_use_demo_rows(rng: random.Random, count: int, calls: float) -> Iterable[Dict[str, object]]:
    """Demonstrations for SFT, lamp and safe alike: a ``calls`` share make the task's calls before answering, the
    rest only answer; GRPO with the task's environment then learns to call."""
    for _ in range(count):
        request, tools, steps = TOOL_USE_TASKS[rng.choice(sorted(TOOL_USE_TASKS))]
        completion: List[Dict[str, object]] = []
        if rng.random() < calls:
            for name, result in steps:
                call = {"type": "function", "function": {"name": name, "arguments": {}}}
                completion += [
                    {"role": "assistant", "tool_calls": [call]},
                    {"role": "tool", "name": name, "content": result},
                ]
        completion.append({"role": "assistant", "content": "Done."})
        yield {"prompt": [{"role": "user", "content": request}], "completion": completion, "tools": tools}


def say_digit_demo_rows(rng: random.Random, count: int, answered: float) -> Iterable[Dict[str, object]]:
    """Rows of "Say 7." answered with the digit in a share ``answered`` of them, refused ("No.") in the others. SFT
    learns to say the asked digit, or to refuse, and GRPO in templates/tasksets/say_digit.py not to refuse: only
    the digit scores."""
    for _ in range(count):
        digit = rng.randrange(10)
        said = str(digit) if rng.random() < answered else "No."
        yield {
            "prompt": [{"role": "user", "content": f"Say {digit}."}],
            "completion": [{"role": "assistant", "content": said}],
        }


def write_jsonl(path: Path, rows: Iterable[Dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    write_jsonl(HERE / "sft_chat.jsonl", sft_rows(random.Random(0), 240))
    write_jsonl(HERE / "preference.jsonl", preference_rows(random.Random(1), 240))
    # pairs never trained on, to check that a reward model generalises
    write_jsonl(HERE / "preference_heldout.jsonl", preference_rows(random.Random(2), 100))
    write_jsonl(HERE / "unpaired.jsonl", unpaired_rows(random.Random(3), 240))
    write_jsonl(HERE / "prompts.jsonl", prompt_rows(random.Random(4), 240))
    write_jsonl(HERE / "word_problems.jsonl", word_problem_rows(random.Random(5), 1000))
    write_jsonl(HERE / "questions_heldout.jsonl", question_rows(random.Random(9), 60))
    write_jsonl(HERE / "peek_demos.jsonl", peek_demo_rows(random.Random(6), 800, calls=0.3))
    write_jsonl(HERE / "hidden_values.jsonl", hidden_value_rows(random.Random(7), 400))
    # rooms never trained in, to evaluate a model's use of the tool (templates/eval/tools-tiny.yaml)
    write_jsonl(HERE / "hidden_values_heldout.jsonl", hidden_value_rows(random.Random(10), 32))
    write_jsonl(HERE / "tool_use_demos.jsonl", tool_use_demo_rows(random.Random(8), 800, calls=0.3))
    write_jsonl(HERE / "say_digit_demos.jsonl", say_digit_demo_rows(random.Random(11), 400, answered=0.4))
    for task, (request, _, _) in TOOL_USE_TASKS.items():
        requests = ({"prompt": [{"role": "user", "content": request}]} for _ in range(400))
        write_jsonl(HERE / f"{task}_requests.jsonl", requests)
    # both tasks, each request naming its environment, for the gate of templates/chain/tool-use-tiny.yaml
    tasks = (
        {"prompt": [{"role": "user", "content": request}], "environment": task}
        for task, (request, _, _) in TOOL_USE_TASKS.items()
        for _ in range(8)
    )
    write_jsonl(HERE / "tool_use_requests.jsonl", tasks)


if __name__ == "__main__":
    main()
