"""The code_tests built-in reward runs each completion's code with its row's tests in a process of its own: real
processes, real limits, a real network namespace (``components/spec/code_runs.py``)."""

import socket
import tempfile
import time
import uuid
from pathlib import Path
from typing import List

import pytest

from posttrain.components.spec import code_runs
from posttrain.components.spec.rewards import builtin_reward, check_builtin

TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\n"


def scores(*answers: str, **args: object) -> List[float]:
    reward = builtin_reward("code_tests", {"timeout_s": 3.0, "memory_mb": 256, **args})
    return reward(list(answers), tests=[TESTS] * len(answers))


def test_code_that_passes_its_tests_scores_1_and_code_that_fails_them_0() -> None:
    fenced = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    chat = [{"role": "assistant", "content": "def add(a, b):\n    return a + b"}]
    assert scores(fenced, "def add(a, b):\n    return a - b", "def add(a, b) return", "") == [1.0, 0.0, 0.0, 0.0]
    reward = builtin_reward("code_tests", {})
    assert reward([chat], tests=[TESTS]) == [1.0]


def test_a_loop_that_never_ends_and_a_memory_hog_score_0_within_the_limits() -> None:
    started = time.monotonic()
    assert scores("while True:\n    pass", "hog = bytearray(2**30)\ndef add(a, b):\n    return a + b") == [0.0, 0.0]
    # the two ran side by side, the loop stopped at its 3 s
    assert time.monotonic() - started < 8


def test_the_code_reaches_no_network_and_sees_none_of_the_jobs_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    assert code_runs.isolation() == code_runs.UNSHARE, "this machine lets unshare make namespaces: CI's does too"
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.5)
        port = server.getsockname()[1]
        calling = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        assert scores(calling + "def add(a, b):\n    return a + b") == [0.0]
        with pytest.raises(socket.timeout):
            server.accept()
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    secretless = "import os\nassert 'HF_TOKEN' not in os.environ\ndef add(a, b):\n    return a + b"
    assert scores(secretless) == [1.0]


def test_nothing_outlives_the_code_no_process_and_no_scratch_directory() -> None:
    marker = f"posttrain-orphan-{uuid.uuid4().hex}"
    orphan = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'], start_new_session=True)\n"
        "open('left.txt', 'w').write('x')\n"
        "def add(a, b):\n    return a + b\n"
    )
    before = set(Path(tempfile.gettempdir()).glob("posttrain-code-*"))
    assert scores(orphan) == [1.0]
    time.sleep(0.5)
    alive = [path for path in Path("/proc").glob("[0-9]*/cmdline") if marker.encode() in _read(path)]
    assert alive == []
    assert set(Path(tempfile.gettempdir()).glob("posttrain-code-*")) == before


def test_its_arguments_are_checked_at_submit() -> None:
    assert check_builtin("code_tests", {"timeout_s": 0}) == [
        "code_tests: expected timeout_s > 0 and memory_mb >= 64 (an interpreter needs about that)"
    ]
    assert check_builtin("code_tests", {"column": "checks", "timeout_s": 30.0, "memory_mb": 2048}) == []


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
