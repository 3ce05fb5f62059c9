"""The program's part: runs a completion's code as ``__main__``, then does what the tests ask of its objects."""

import json
import os
import sys
import types
from typing import Any, Callable, Dict, List

from .crossing import decode, encode


def plain(value: Any) -> Any:
    """A handle's object as plain data, for a comparison: an instance of a subclass of a plain type as that type,
    numpy's arrays and scalars as lists and numbers; anything else cannot be."""
    for kind in (bool, int, float, complex, str, bytes):
        if isinstance(value, kind):
            return kind(value)
    for kind in (list, tuple, set, frozenset):
        if isinstance(value, kind):
            return kind(plain(item) for item in value)
    if isinstance(value, dict):
        return {plain(key): plain(item) for key, item in value.items()}
    for convert in ("tolist", "item"):
        if callable(getattr(value, convert, None)):
            return plain(getattr(value, convert)())
    raise TypeError(f"a {type(value).__name__} is not plain data")


# what the tests may ask of one of the program's objects; "call" sends back the arguments too, as the call left them
OPERATIONS: Dict[str, Callable[..., Any]] = {
    "call": lambda target, args, kwargs: [target(*args, **kwargs), args, kwargs],
    "getattr": getattr,
    "setattr": setattr,
    "getitem": lambda target, key: target[key],
    "setitem": lambda target, key, value: target.__setitem__(key, value),
    "len": len,
    "iter": iter,
    "next": next,
    "bool": bool,
    "str": str,
    "repr": repr,
    "float": float,
    "int": int,
    "index": lambda target: target.__index__(),
    "plain": plain,
}


def play_program(code: str, requests_fd: int, answers_fd: int) -> None:
    """Runs ``code`` as ``__main__``; then, unless it ended the process, answers the tests' requests until they
    close their end."""
    requests = os.fdopen(requests_fd, "r", encoding="utf-8")
    answers = os.fdopen(answers_fd, "w", encoding="utf-8")
    held: List[Any] = []

    def hold(value: Any) -> int:
        held.append(value)
        return len(held) - 1

    def handle(value: Any) -> Any:
        # numpy's arrays and scalars cross as lists and numbers
        if type(value).__module__ == "numpy" and callable(getattr(value, "tolist", None)):
            return encode(value.tolist(), handle)
        return {"handle": hold(value)}

    # a file, so that its traceback shows its lines
    with open("program.py", "w") as file:
        file.write(code)
    main = types.ModuleType("__main__")
    main.__file__ = os.path.abspath("program.py")
    sys.modules["__main__"] = main
    sys.argv = ["program.py"]
    try:
        exec(compile(code, main.__file__, "exec"), vars(main))
    except Exception as error:
        _print_traceback(error)
        sys.exit(1)

    defined = {name: value for name, value in vars(main).items() if not (name.startswith("__") and name.endswith("__"))}
    modules = {name: value.__name__ for name, value in defined.items() if isinstance(value, types.ModuleType)}
    objects = {name: hold(value) for name, value in defined.items() if name not in modules}
    answers.write(json.dumps([objects, modules]) + "\n")
    answers.flush()
    for line in requests:
        # the tests' requests: well formed, they are the harness's own
        operation, target, *arguments = json.loads(line)
        try:
            value = OPERATIONS[operation](held[target], *[decode(argument, held.__getitem__) for argument in arguments])
            reply: Dict[str, Any] = {"value": encode(value, handle)}
        except StopIteration:
            reply = {"stop": True}
        except Exception as error:
            # a call ran the program's code; the rest (a missing attribute, an object not plain) is no news
            if operation == "call":
                _print_traceback(error)
            reply = {"error": [type(error).__name__, str(error)[:500]]}
        answers.write(json.dumps(reply) + "\n")
        answers.flush()


def _print_traceback(error: Exception) -> None:
    """The error's traceback on stderr (kept with the sample), from the program's first frame on."""
    trace = error.__traceback__
    while trace is not None and trace.tb_frame.f_code.co_filename == __file__:
        trace = trace.tb_next
    sys.__excepthook__(type(error), error.with_traceback(trace), trace)
