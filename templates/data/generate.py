"""Writes the small data sets the tiny templates train on (deterministic).

    python templates/data/generate.py

Each carries a pattern a tiny model learns in a few dozen steps on CPU.
"""

import json
import random
from pathlib import Path
from typing import Dict, Iterable, List

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


def write_jsonl(path: Path, rows: Iterable[Dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    write_jsonl(HERE / "sft_chat.jsonl", sft_rows(random.Random(0), 240))


if __name__ == "__main__":
    main()
