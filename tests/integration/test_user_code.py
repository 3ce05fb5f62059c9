"""The user's tools and environments, called as TRL calls them, in real processes: one that never returns or ends its
process ends the process in one line naming it (on stderr and in torchelastic's error file), in whichever thread it
ran; one that returns or raises is left to the trainer, and the model sees the same tool. (Rewards, through a real
GRPO job: ``tests/e2e/test_job_errors.py``.)"""

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from transformers.utils.chat_template_utils import get_json_schema

from posttrain.components.spec.sections import EnvironmentSource, ToolSource
from posttrain.entrypoints.inputs.tools import resolve_environment, resolve_tools

USER_MODULE = '''
import asyncio, sys, time


def lookup(room: str) -> str:
    """What is in a room.

    Args:
        room: the room's name
    """
    if room == "attic":
        time.sleep(3600)
    if room == "cellar":
        raise KeyError(room)
    return f"a lamp in the {room}"


async def shout(word: str) -> str:
    """Says a word loudly.

    Args:
        word: the word
    """
    sys.exit(5)


class Rooms:
    def __init__(self, size: int = 2):
        self.size = size

    def reset(self, **row):
        return None

    def look(self, where: str) -> str:
        """Looks somewhere.

        Args:
            where: the place
        """
        while True:
            pass
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "user_tools.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def run_calls(user_module: Path, body: str) -> subprocess.CompletedProcess:
    """``body`` in a process of its own, with the user's module importable and an error file to write."""
    code = textwrap.dedent("""
        import asyncio, sys, threading
        from posttrain.components.spec.sections import EnvironmentSource, ToolSource
        from posttrain.entrypoints.inputs.tools import resolve_environment, resolve_tools
    """) + textwrap.dedent(body)
    env = {"PYTHONPATH": str(user_module), "TORCHELASTIC_ERROR_FILE": str(user_module / "error.json")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def assert_ended_in(result: subprocess.CompletedProcess, user_module: Path, line: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == line
    assert json.loads((user_module / "error.json").read_text())["message"]["message"] == line


def test_a_tool_that_never_returns_ends_the_process_within_its_timeout_naming_it(user_module: Path) -> None:
    started = time.monotonic()
    result = run_calls(
        user_module,
        """
        [lookup] = resolve_tools([ToolSource(function="user_tools:lookup", timeout_s=1)])
        print(lookup(room="hall"), flush=True)
        lookup(room="attic")
        """,
    )
    assert result.stdout == "a lamp in the hall\n"
    assert_ended_in(
        result,
        user_module,
        "posttrain: tools.0 (lookup) did not return within 1 s (tools.0.timeout_s); the job stops: make it return "
        "sooner, or give it longer (tools.0.timeout_s)",
    )
    # the interpreter's start and imports included
    assert time.monotonic() - started < 30


def test_an_agent_program_that_blocks_its_event_loop_ends_the_process_in_one_line(user_module: Path) -> None:
    """An episode's timeout runs on the event loop, which a blocking program stops: the play is bounded apart."""
    (user_module / "user_agents.py").write_text(
        "import time\n\nasync def solve(client, model, row):\n    time.sleep(3600)\n"
    )
    started = time.monotonic()
    result = run_calls(
        user_module,
        """
        from posttrain.components.spec import sections
        from posttrain.components.spec.sections import AgentProgram
        from posttrain.entrypoints.generation import agents
        from posttrain.entrypoints.generation.endpoint import Endpoint

        sections.PLAY_GRACE_S = 1
        program = agents.resolve(AgentProgram(function="user_agents:solve", timeout_s=1))
        with Endpoint(lambda requests: [], None, None, "policy", 512, []).serving() as endpoint:
            agents.play(endpoint, program, "policy", [{"prompt": "hi"}] * 3, 2)
        print("went on", flush=True)
        """,
    )
    assert "went on" not in result.stdout
    assert_ended_in(
        result,
        user_module,
        "posttrain: agent: 6 episode(s) did not end within 2 s, each bounded by agent.timeout_s (1 s): the program "
        "blocks its event loop (time.sleep, a blocking client?); await the async client it is given",
    )
    assert time.monotonic() - started < 30


def test_an_async_tool_that_calls_sys_exit_on_an_event_loop_thread_ends_the_process_naming_it(
    user_module: Path,
) -> None:
    # as TRL awaits async tools: on an event loop of its own, in a daemon thread
    result = run_calls(
        user_module,
        """
        [shout] = resolve_tools([ToolSource(function="user_tools:shout")])
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(shout(word="hey"), loop).result(timeout=60)
        print("went on", flush=True)
        """,
    )
    assert "went on" not in result.stdout
    assert_ended_in(
        result,
        user_module,
        "posttrain: tools.0 (shout) called sys.exit(5): the job stops; user code returns (or raises), it does not "
        "end the process",
    )


def test_an_environment_method_that_never_returns_ends_the_process_naming_the_class_and_method(
    user_module: Path,
) -> None:
    result = run_calls(
        user_module,
        """
        factory = resolve_environment(EnvironmentSource(factory="user_tools:Rooms", timeout_s=1), scored=True)
        rooms = factory()
        rooms.reset(prompt="x")
        rooms.look(where="up")
        """,
    )
    assert_ended_in(
        result,
        user_module,
        "posttrain: environment (Rooms.look) did not return within 1 s (environment.timeout_s); the job stops: make "
        "it return sooner, or give it longer (environment.timeout_s)",
    )


def test_a_bounded_tool_is_the_same_tool_to_the_model_and_its_errors_are_the_trainers(user_module: Path) -> None:
    import user_tools

    [lookup] = resolve_tools([ToolSource(function="user_tools:lookup")])
    assert get_json_schema(lookup) == get_json_schema(user_tools.lookup)
    assert lookup(room="hall") == "a lamp in the hall"
    # TRL reads a tool's exception back to the model as its result
    with pytest.raises(KeyError):
        lookup(room="cellar")
    factory = resolve_environment(EnvironmentSource(factory="user_tools:Rooms", args={"size": 3}), scored=True)
    rooms = factory()
    assert rooms.size == 3 and get_json_schema(rooms.look) == get_json_schema(user_tools.Rooms(3).look)
