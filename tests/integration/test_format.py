"""The layout is the formatter's: ``ruff format`` and ``ruff check`` (configured in pyproject.toml) pass on the
whole repository, and no line is held out of them. Files are split by concern, not by length."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

RUFF = Path(sys.executable).parent / "ruff"
HELD_OUT = re.compile(r"#\s*fmt:\s*(skip|off)")


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=" ".join)
def test_ruff_passes(command) -> None:
    result = subprocess.run([str(RUFF), *command, "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, f"ruff {' '.join(command)} .:\n{result.stdout}{result.stderr}"


def test_no_line_is_held_out_of_the_formatter() -> None:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    held = [
        f"{path}:{number}"
        for path in tracked.stdout.split()
        for number, line in enumerate((REPO / path).read_text().splitlines(), 1)
        if HELD_OUT.search(line)
    ]
    assert not held, f"lines held out of ruff format: {held}"
