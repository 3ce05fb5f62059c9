"""Fixtures and markers shared by the test suite."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def session_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory shared by the session's expensive runs (the RLHF chain reuses outputs)."""
    return tmp_path_factory.mktemp("posttrain")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: runs real training jobs through torchx (a minute or more each)")
    config.addinivalue_line("markers", "slurm: needs the Slurm cluster that .ci/run starts")
