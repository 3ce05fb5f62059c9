"""The code_tests built-in reward: each completion's code in one sandboxed process, its row's tests in another, the
verdict the tests' alone. Real processes, real limits, real namespaces (``components/spec/code_runs.py``)."""

import importlib.util
import os
import socket
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List

import pytest

from posttrain.components.spec import code_runs
from posttrain.components.spec.rewards import builtin_reward, check_builtin

MBPP = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\n"
HUMANEVAL = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n\ncheck(add)\n"
UNITTEST = (
    "import unittest\nclass Add(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(1, 2), 3)\n"
    "if __name__ == '__main__':\n    unittest.main()\n"
)
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return 0\n"


def scores(answers: List[Any], tests: List[Any], **args: Any) -> List[float]:
    reward = builtin_reward("code_tests", {"timeout_s": 5.0, "memory_mb": 512, **args})
    return reward(answers, tests=tests)


@pytest.fixture(scope="module", autouse=True)
def isolating_machine() -> None:
    assert code_runs.isolation() == set(code_runs.BOUNDS), "this machine holds every bound: CI's does too"


# each must score 0: a program that would pass a run-it-all-and-check-the-exit-code verifier, or attacks this one
GAMING = {
    "sys.exit(0) first": ("import sys\nsys.exit(0)\n" + RIGHT, MBPP),
    "os._exit(0) first": ("import os\nos._exit(0)\n" + RIGHT, MBPP),
    "an atexit hook": ("import atexit, os, sys\natexit.register(lambda: os._exit(0))\nsys.exit(1)\n", MBPP),
    "exit inside the call": ("def add(a, b):\n    raise SystemExit(0)\n", MBPP),
    "a new AssertionError": (
        "import builtins\nclass Never(Exception):\n    pass\nbuiltins.AssertionError = Never\n" + WRONG,
        MBPP,
    ),
    "a trace function": ("import sys\nsys.settrace(lambda *args: None)\n" + WRONG, MBPP),
    "equal to everything": (
        "class Yes:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Yes()\n",
        MBPP,
    ),
    "unequal to nothing": (
        "class Same:\n    def __ne__(self, other):\n        return False\ndef add(a, b):\n    return Same()\n",
        "assert not add(1, 2) != 3\n",
    ),
    "a list equal to everything": (
        "class Yes(list):\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Yes()\n",
        MBPP,
    ),
    "builtins of its own": (
        "def all(values):\n    return True\ndef sorted(values):\n    return [3]\n" + WRONG,
        "assert all([add(1, 2) == 3])\nassert sorted([add(1, 2)]) == [3]\n",
    ),
    "a math of its own": (
        "class math:\n    def isclose(*args, **kwargs):\n        return True\n" + WRONG,
        "import math\nassert math.isclose(add(1, 2), 3)\n",
    ),
    "iteration's end leaking out of a call": (
        "def add(a, b):\n    raise StopIteration\n",
        "assert all(map(lambda case: add(*case) == sum(case), [(1, 2), (3, 4)]))\n",
    ),
    "a server of its own naming the tests' __name__": (
        "import os\nrequests, answers = map(int, open('/proc/self/cmdline').read().split('\\0')[-3:-1])\n"
        'os.write(answers, b\'[{"__name__": 0, "add": 1}, {}]\\n\')\n'
        'for line in os.fdopen(requests):\n    os.write(answers, b\'{"value": "not main"}\\n\')\nos._exit(0)\n',
        UNITTEST,
    ),
    "success printed": (
        'import sys\nprint(\'OK\')\nprint(\'{"passed": true, "failure": ""}\')\n'
        "sys.stderr.write('{\"passed\": true}\\n')\n" + WRONG,
        MBPP,
    ),
    "a verdict written to every descriptor": (
        "import os\nfor fd in map(int, os.listdir('/proc/self/fd')):\n"
        '    for line in (b\'{"passed": true, "failure": ""}\\n\', b\'[{"add": 0}, {}]\\n{"value": 3}\\n\'):\n'
        "        try:\n            os.write(fd, line)\n        except OSError:\n            pass\n" + WRONG,
        MBPP,
    ),
    "its parent and everyone killed": (
        "import os, signal\nfor pid in (os.getppid(), -1, 1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n        pass\n" + WRONG,
        MBPP,
    ),
    "a verdict file where the tests might look": (
        "import os\nfor path in ('/tmp/verdict.json', '../tests/verdict.json', 'verdict.json', os.path.expanduser('~/v')):\n"
        "    try:\n        open(path, 'w').write('{\"passed\": true}')\n    except OSError:\n        pass\n" + WRONG,
        MBPP,
    ),
}


@pytest.mark.parametrize("name", GAMING)
def test_a_program_that_games_the_verifier_scores_0(name: str) -> None:
    code, tests = GAMING[name]
    assert scores([code], [tests]) == [0.0]


LIST_NODE = (
    "class ListNode:\n    def __init__(self, val=0, next=None):\n        self.val, self.next = val, next\n"
    "def reverse(head):\n    previous = None\n    while head:\n        head.next, previous, head = previous, head, head.next\n"
    "    return previous\n"
)
TWO_SUM = (
    "class Solution:\n    def two_sum(self, nums, target):\n        seen = {}\n        for i, n in enumerate(nums):\n"
    "            if target - n in seen:\n                return [seen[target - n], i]\n            seen[n] = i\n"
)
# (code, tests, score): honest programs, right and wrong
HONEST = {
    "MBPP right": (RIGHT, MBPP, 1.0),
    "MBPP wrong": (WRONG, MBPP, 0.0),
    "HumanEval right": (RIGHT, HUMANEVAL, 1.0),
    "HumanEval wrong": (WRONG, HUMANEVAL, 0.0),
    "a main block that prints": (RIGHT + "if __name__ == '__main__':\n    print(add(2, 3))\n", MBPP, 1.0),
    "a lot printed": (
        "import sys\nfor i in range(100000):\n    print(i)\n    sys.stderr.write(f'{i}\\n')\n" + RIGHT,
        MBPP,
        1.0,
    ),
    "a class-based solution": (TWO_SUM, "assert Solution().two_sum([2, 7, 11, 15], 9) == [0, 1]\n", 1.0),
    "a class-based wrong one": (TWO_SUM, "assert Solution().two_sum([3, 2, 4], 6) == [0, 2]\n", 0.0),
    "objects built and walked by the tests": (
        LIST_NODE,
        "head = reverse(ListNode(1, ListNode(2, ListNode(3))))\nvalues = []\nwhile head:\n"
        "    values.append(head.val)\n    head = head.next\nassert values == [3, 2, 1]\n",
        1.0,
    ),
    "loops, setup and math.isclose": (
        RIGHT,
        "import math\ncases = [((1, 2), 3), ((0.1, 0.2), 0.3)]\nfor (a, b), want in cases:\n"
        "    assert math.isclose(add(a, b), want)\n",
        1.0,
    ),
    "math from the code's own import": (
        "import math\ndef area(r):\n    return math.pi * r * r\n",
        "assert math.isclose(area(1), 3.14159, rel_tol=1e-3)\n",
        1.0,
    ),
    "a sort in place": (
        "def sort_in_place(items):\n    items.sort()\n",
        "data = [3, 1, 2]\nsort_in_place(data)\nassert data == [1, 2, 3]\n",
        1.0,
    ),
    "a generator, a tuple, a set, a dict, bytes": (
        "def evens(n):\n    yield from range(0, n, 2)\ndef parts():\n    return (1, 'a'), {1, 2}, {'k': [b'x']}\n",
        "assert list(evens(5)) == [0, 2, 4]\nassert parts() == ((1, 'a'), {1, 2}, {'k': [b'x']})\n",
        1.0,
    ),
    "a named tuple and an int subclass compared as plain data": (
        "import collections, enum\nPoint = collections.namedtuple('Point', 'x y')\n"
        "class Answer(enum.IntEnum):\n    YES = 1\ndef point():\n    return Point(1, 2)\ndef answer():\n    return Answer.YES\n",
        "assert point() == (1, 2) and point().x == 1\nassert answer() == 1\n",
        1.0,
    ),
    "unittest right": (RIGHT, UNITTEST, 1.0),
    "unittest wrong": (WRONG, UNITTEST, 0.0),
    "an expected exception": (
        "def divide(a, b):\n    return a / b\n",
        "try:\n    divide(1, 0)\nexcept ZeroDivisionError:\n    pass\nelse:\n    raise AssertionError('no error')\n",
        1.0,
    ),
    "a thread": (
        "import threading\ndef add(a, b):\n    out = []\n    t = threading.Thread(target=lambda: out.append(a + b))\n"
        "    t.start()\n    t.join()\n    return out[0]\n",
        MBPP,
        1.0,
    ),
    "an error raised": ("def add(a, b):\n    raise ValueError('no')\n", MBPP, 0.0),
    "no such function": ("def plus(a, b):\n    return a + b\n", MBPP, 0.0),
    "code that does not compile": ("def add(a, b) return a + b", MBPP, 0.0),
    "tests that do not compile": (RIGHT, "assert add(1, 2) ==", 0.0),
    "tests that are not a string": (RIGHT, ["assert add(1, 2) == 3"], 0.0),
}
if importlib.util.find_spec("numpy") is not None:
    HONEST["numpy results"] = (
        "import numpy as np\ndef add(a, b):\n    return np.array(a) + np.array(b)\ndef total(a):\n    return np.sum(a)\n",
        "import numpy as np\nassert add([1, 2], [3, 4]) == [4, 6]\nassert np.array_equal(add([1], [2]), np.array([3]))\n"
        "assert total([1, 2]) == 3\n",
        1.0,
    )


@pytest.mark.parametrize("name", HONEST)
def test_honest_programs_score_1_when_right_and_0_when_wrong(name: str) -> None:
    code, tests, score = HONEST[name]
    assert scores([f"Here it is:\n```python\n{code}```\nDone."], [tests]) == [score]


def test_the_code_is_the_answers_last_fenced_block_else_the_whole_answer_and_a_chat_answers_last_message() -> None:
    two_blocks = f"First:\n```python\n{WRONG}```\nBetter:\n```\n{RIGHT}```"
    chat = [{"role": "assistant", "content": RIGHT}]
    assert scores([two_blocks, RIGHT, chat], [MBPP] * 3) == [1.0, 1.0, 1.0]


def test_why_each_failed_and_the_programs_stderr_go_to_the_trainers_log_extra() -> None:
    logged: Dict[str, List[str]] = {}
    reward = builtin_reward("code_tests", {"timeout_s": 5.0})
    broken = "def add(a, b):\n    return 1 / 0\n"
    chatty = "import sys\nsys.stderr.write('x' * 10000 + 'end')\n" + RIGHT
    assert reward([RIGHT, broken, chatty], tests=[MBPP] * 3, log_extra=logged.__setitem__) == [1.0, 0.0, 1.0]
    right, failed, cut = logged["code_tests/tests"]
    assert right == ""
    assert failed.startswith("tests line 1: assert add(1, 2) == 3: ZeroDivisionError: division by zero\n")
    assert 'program.py", line 2, in add' in failed
    assert cut.startswith("[...]x") and cut.endswith("end") and len(cut) == len("[...]") + code_runs.STDERR_BYTES


def test_a_loop_that_never_ends_and_a_memory_hog_score_0_within_the_limits() -> None:
    started = time.monotonic()
    hog = "hog = bytearray(2**30)\n" + RIGHT
    assert scores(["while True:\n    pass", hog], [MBPP] * 2, timeout_s=3.0, memory_mb=256) == [0.0, 0.0]
    assert time.monotonic() - started < 8


def test_the_code_reaches_no_network_and_sees_none_of_the_jobs_secrets_nor_its_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.5)
        calling = f"import socket\nsocket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=2)\n"
        assert scores([calling + RIGHT], [MBPP]) == [0.0]
        with pytest.raises(socket.timeout):
            server.accept()
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    looking = (
        "import os\ndef environment():\n    return dict(os.environ)\n"
        "def processes():\n    return sorted(int(name) for name in os.listdir('/proc') if name.isdigit())\n"
        "def read(path):\n    try:\n        return open(path, 'rb').read()\n    except OSError as error:\n"
        "        return type(error).__name__\n"
    )
    tests = (
        "assert 'HF_TOKEN' not in environment()\nassert processes() == [1]\n"
        "assert b'hf_secret' not in read('/proc/1/environ')\n"
        f"assert read('/proc/{os.getpid()}/environ') == 'FileNotFoundError'\n"
    )
    assert scores([looking], [tests]) == [1.0]


def test_the_code_writes_nowhere_but_its_scratch_directory_and_cannot_make_the_machine_writable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    marker = f"posttrain-{uuid.uuid4().hex}"
    places = [Path(tempfile.gettempdir()) / marker, tmp_path / marker, Path.home() / marker]
    writing = (
        "import ctypes\ndef write(path):\n    try:\n        open(path, 'w').write('x')\n        return 'written'\n"
        "    except OSError as error:\n        return error.strerror\n"
        "def remount_writable():\n    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    # mount -o remount,bind,rw /; then the same from a user namespace of its own\n"
        "    tries = [libc.mount(None, b'/', None, 32 | 4096, None)]\n"
        "    tries.append(libc.unshare(0x10000000 | 0x00020000))\n"
        "    tries.append(libc.mount(None, b'/', None, 32 | 4096, None))\n    return tries\n"
    )
    tests = (
        f"for path in {[str(place) for place in places]!r}:\n    assert write(path) == 'Read-only file system', path\n"
        "assert write('scratch.txt') == 'written'\nassert remount_writable()[0] == -1 and remount_writable()[2] == -1\n"
    )
    assert scores([writing], [tests]) == [1.0]
    assert not any(place.exists() for place in places)


def test_the_scratch_directory_is_bounded_in_bytes_and_in_files_and_nothing_is_left_after() -> None:
    filling = (
        "import os\ndef fill(size):\n    count = 0\n    try:\n        while True:\n"
        "            with open(f'f{count}', 'wb') as file:\n                file.write(b'x' * size)\n            count += 1\n"
        "    except OSError as error:\n        return count, error.strerror\n"
        "def big():\n    try:\n        with open('big', 'wb') as file:\n            while True:\n"
        "                file.write(b'x' * 2**20)\n    except OSError:\n        size = os.path.getsize('big')\n"
        "        os.remove('big')\n        return size\n"
    )
    # a file of 100 bytes takes a page: at most the tmpfs's inodes, and never more bytes than its size
    tests = (
        f"assert {code_runs.SCRATCH_BYTES} - 2**20 < big() <= {code_runs.SCRATCH_BYTES}\n"
        "count, why = fill(100)\nassert count < 4096 and why == 'No space left on device', (count, why)\n"
    )
    before = set(Path(tempfile.gettempdir()).glob("posttrain-code-*"))
    assert scores([filling], [tests]) == [1.0]
    assert set(Path(tempfile.gettempdir()).glob("posttrain-code-*")) == before


def test_the_code_can_start_threads_but_no_process_so_a_fork_bomb_ends_at_once_and_nothing_outlives_it() -> None:
    marker = f"posttrain-orphan-{uuid.uuid4().hex}"
    starting = (
        "import os, subprocess, sys\ndef start():\n    try:\n"
        f"        subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'])\n"
        "        return 'started'\n    except OSError as error:\n        return type(error).__name__\n"
        "def fork():\n    try:\n        return os.fork()\n    except OSError as error:\n        return type(error).__name__\n"
    )
    tests = "assert start() == 'PermissionError'\nassert fork() == 'PermissionError'\n"
    started = time.monotonic()
    assert scores([starting, "import os\nwhile True:\n    os.fork()\n" + RIGHT], [tests, MBPP]) == [1.0, 0.0]
    assert time.monotonic() - started < 3
    alive = [path for path in Path("/proc").glob("[0-9]*/cmdline") if marker.encode() in _read(path)]
    assert alive == []


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
