"""The layout rule from the style guide: files of one concern, at most 400 lines."""

import pytest
from helpers import REPO

SOURCES = sorted(p.relative_to(REPO) for folder in ("components", "entrypoints") for p in (REPO / folder).glob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=str)
def test_no_source_file_grows_past_400_lines(path) -> None:
    lines = len((REPO / path).read_text().splitlines())
    assert lines <= 400, f"{path}: {lines} lines; split it by concern"
