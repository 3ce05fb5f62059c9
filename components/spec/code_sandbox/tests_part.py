"""The tests' part: runs a row's tests with the program's names bound to handles (:class:`Handle`), compares what comes
back here, and gives the verdict."""

import builtins
import importlib
import json
import os
import sys
import types
from typing import Any, Dict

from .crossing import decode, encode


class ProgramLost(BaseException):
    """The program stopped answering (a BaseException: a test's ``except Exception`` does not hide it)."""


class ProgramError(Exception):
    """An error the program raised that is no built-in exception here."""


class Program:
    """The tests' end of the pipes to the program."""

    def __init__(self, requests_fd: int, answers_fd: int) -> None:
        self.requests = os.fdopen(requests_fd, "w", encoding="utf-8")
        self.answers = os.fdopen(answers_fd, "r", encoding="utf-8")
        # why the program stopped answering, once it has: the verdict is then a failure, whatever the tests caught
        self.lost = ""

    def read(self) -> Any:
        """The program's next line, as JSON."""
        try:
            line = self.answers.readline()
            if line:
                return json.loads(line)
            self.lost = "the program ended before answering"
        except (OSError, ValueError, MemoryError, RecursionError) as error:
            self.lost = f"the program answered what is not a reply: {type(error).__name__}"
        raise ProgramLost(self.lost)

    def ask(self, operation: str, target: int, *arguments: Any) -> Any:
        """What the program says to ``operation`` on its object ``target``, decoded."""
        if self.lost:
            raise ProgramLost(self.lost)
        request = json.dumps([operation, target, *[encode(argument, _handle_number) for argument in arguments]])
        try:
            self.requests.write(request + "\n")
            self.requests.flush()
        except OSError:
            self.lost = "the program ended before answering"
            raise ProgramLost(self.lost) from None
        reply = self.read()
        if type(reply) is dict and len(reply) == 1:
            [(kind, content)] = reply.items()
            if kind == "value":
                try:
                    return decode(content, Handle)
                except (ValueError, TypeError, RecursionError) as error:
                    self.lost = f"the program answered what is not plain data: {error}"
                    raise ProgramLost(self.lost) from None
            if kind == "stop":
                raise StopIteration if operation == "next" else ProgramError("StopIteration")
            if kind == "error" and type(content) is list and [type(part) for part in content] == [str, str]:
                raise _error(*content)
        self.lost = f"the program answered what is not a reply: {str(reply)[:80]}"
        raise ProgramLost(self.lost)


def _error(name: str, message: str) -> Exception:
    """The program's error as the built-in exception of that name, where there is one; iteration's end and the
    exceptions that end a process are not the program's to raise here."""
    kind = getattr(builtins, name, None)
    if (
        isinstance(kind, type)
        and issubclass(kind, Exception)
        and not issubclass(kind, (StopIteration, StopAsyncIteration))
    ):
        try:
            return kind(message)
        except TypeError:
            pass
    return ProgramError(f"{name}: {message}")


PROGRAM: Program


def _handle_number(value: Any) -> Dict[str, int]:
    if isinstance(value, Handle):
        return {"handle": object.__getattribute__(value, "_number")}
    raise TypeError(f"a {type(value).__name__} cannot go to the program: only plain data and its own objects can")


NOT_PLAIN = object()


class Handle:
    """One of the program's objects, held by the tests. What they do with it (call it, read an attribute, index or
    iterate it), the program does, answering with plain data or another handle; what they compare it with (``==``,
    ``<``, ``in``), they compare here, with the plain data the program makes of it: a handle the program cannot make
    plain data of equals nothing."""

    __slots__ = ("_number",)

    def __init__(self, number: int) -> None:
        object.__setattr__(self, "_number", number)

    def _ask(self, operation: str, *arguments: Any) -> Any:
        return PROGRAM.ask(operation, object.__getattribute__(self, "_number"), *arguments)

    def _typed(self, operation: str, kind: type) -> Any:
        value = self._ask(operation)
        if type(value) is not kind:
            raise TypeError(f"the program's {operation} gave a {type(value).__name__}, not a {kind.__name__}")
        return value

    def _plain(self) -> Any:
        try:
            return self._ask("plain")
        except Exception:
            return NOT_PLAIN

    def _comparable(self) -> Any:
        value = self._plain()
        if value is NOT_PLAIN:
            raise TypeError("the program's object is not plain data, so it cannot be ordered or searched")
        return value

    def __getattr__(self, name: str) -> Any:
        return self._ask("getattr", name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._ask("setattr", name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result, args_after, kwargs_after = self._ask("call", list(args), kwargs)
        # what the call did to a list, dict or set it was given (an in-place sort), done to the tests' own
        for given, after in zip([*args, *kwargs.values()], [*args_after, *kwargs_after.values()]):
            if type(given) is list and type(after) is list:
                given[:] = after
            elif type(given) in (dict, set) and type(after) is type(given):
                given.clear()
                given.update(after)
        return result

    def __getitem__(self, key: Any) -> Any:
        return self._ask("getitem", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._ask("setitem", key, value)

    def __iter__(self) -> Any:
        iterator = self._ask("iter")
        return iterator if isinstance(iterator, Handle) else iter(iterator)

    def __next__(self) -> Any:
        return self._ask("next")

    def __len__(self) -> int:
        return self._typed("len", int)

    def __bool__(self) -> bool:
        return self._typed("bool", bool)

    def __str__(self) -> str:
        return self._typed("str", str)

    def __repr__(self) -> str:
        return self._typed("repr", str)

    def __float__(self) -> float:
        return self._typed("float", float)

    def __int__(self) -> int:
        return self._typed("int", int)

    def __index__(self) -> int:
        return self._typed("index", int)

    def __eq__(self, other: Any) -> bool:
        value = self._plain()
        return value is not NOT_PLAIN and value == other

    def __ne__(self, other: Any) -> bool:
        return not self == other

    def __lt__(self, other: Any) -> bool:
        return self._comparable() < other

    def __le__(self, other: Any) -> bool:
        return self._comparable() <= other

    def __gt__(self, other: Any) -> bool:
        return self._comparable() > other

    def __ge__(self, other: Any) -> bool:
        return self._comparable() >= other

    def __contains__(self, item: Any) -> bool:
        return item in self._comparable()


def play_tests(tests: str, requests_fd: int, answers_fd: int) -> Dict[str, Any]:
    """Runs ``tests`` against the program; the verdict: whether they passed, and where they failed."""
    global PROGRAM
    try:
        compiled = compile(tests, "tests", "exec")
    except (SyntaxError, ValueError) as error:
        return {"passed": False, "failure": f"the tests do not compile: {error}"}
    PROGRAM = Program(requests_fd, answers_fd)
    try:
        names = PROGRAM.read()
    except ProgramLost:
        return {"passed": False, "failure": "the program ended before its tests ran"}
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    sys.argv = ["tests"]
    if not (type(names) is list and len(names) == 2 and all(type(part) is dict for part in names)):
        return {"passed": False, "failure": "the program did not name what it defined"}
    objects, modules = names
    # the tests' builtins and their module's own names (``__name__``) stay theirs: a program's ``all`` does not judge
    kept = {name for name in objects.keys() | modules.keys() if hasattr(builtins, name) or name.startswith("__")}
    for name, target in objects.items():
        if type(target) is int and name not in kept:
            setattr(main, name, Handle(target))
    for name, module in modules.items():
        # the sandbox's own modules are no program's to hand the tests
        ours = module == __package__ or module.startswith(f"{__package__}.") if type(module) is str else True
        if not ours and name not in kept:
            try:
                setattr(main, name, importlib.import_module(module))
            except Exception:
                pass
    try:
        exec(compiled, vars(main))
        failure = ""
    except SystemExit as exit:
        # unittest.main() exits with False or True
        status = int(exit.code) if isinstance(exit.code, bool) else exit.code
        failure = "" if status in (None, 0) else f"the tests exited with {status}"
    except BaseException as error:
        failure = _where(error, tests)
    failure = failure or PROGRAM.lost
    return {"passed": not failure, "failure": failure[:500]}


def _where(error: BaseException, tests: str) -> str:
    """The line of the tests an error came from, and the error."""
    line, trace = 0, error.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code.co_filename == "tests":
            line = trace.tb_lineno
        trace = trace.tb_next
    source = tests.splitlines()[line - 1].strip() if 0 < line <= len(tests.splitlines()) else ""
    what = type(error).__name__ + (f": {error}" if str(error) else "")
    return f"tests line {line}: {source}: {what}" if line else what
