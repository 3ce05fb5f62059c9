"""The user's code the job calls while it trains or evaluates (reward functions, tools, environments), bounded.

Each call either returns, raises (what the trainer does with an error stays
its own: a tool's error is the model's to read, a reward's a crash named by
its frame), or ends the job in one ``posttrain:`` line naming the function:

- a call that does not return within its ``timeout_s`` (the spec's key beside
  the function; :data:`USER_CODE_TIMEOUT_S` where it sets none). A thread that
  hangs cannot be stopped from Python, nor its rank left behind while the others
  wait, so the job ends; the line says which function, and for how long;
- a call that ends the process (``sys.exit``, ``raise SystemExit``): the line
  names the function and the exit code. ``os._exit`` cannot be caught here: the
  launcher refuses a rank that ended without finishing its run.

The line is said by the rank that met it, and left in torchelastic's error file
(``error_file.stop_now``), in whichever thread the call ran (TRL awaits async
rewards and tools on an event loop of its own).
"""

import contextlib
import functools
import inspect
from typing import Any, Callable, Iterator, Optional

from trl.trainer.utils import is_async_callable

from posttrain.components.spec.sections import USER_CODE_TIMEOUT_S
from posttrain.entrypoints.process.error_file import deadline, stop_now


def guarded(function: Callable[..., Any], where: str, timeout_s: Optional[float]) -> Callable[..., Any]:
    """``function`` bounded as above, under its own name, signature and docstring (a tool's schema reads them), and
    awaitable where it is; ``where`` is the spec's key naming it (``rewards.0``, ``tools.1``)."""
    name = getattr(function, "__name__", type(function).__name__)
    return _bounded(function, f"{where} ({name})", f"{where}.timeout_s", timeout_s)


def guarded_environment(factory: Callable[[], Any], where: str, timeout_s: Optional[float]) -> Callable[[], Any]:
    """An environment's factory whose instances are built, and whose methods run, bounded as above: each public
    method (the model's tools, ``reset``, ``get_reward``) set on the instance, guarded."""
    built = _bounded(factory, f"{where} ({_class_name(factory)})", f"{where}.timeout_s", timeout_s)

    @functools.wraps(factory)
    def build() -> Any:
        instance = built()
        kind = type(instance).__name__
        # as TRL lists them: on the class (the instance's properties are not evaluated)
        for method, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction):
            if not method.startswith("_"):
                bound = getattr(instance, method)
                setattr(
                    instance, method, _bounded(bound, f"{where} ({kind}.{method})", f"{where}.timeout_s", timeout_s)
                )
        return instance

    return build


def _bounded(function: Callable[..., Any], label: str, key: str, timeout_s: Optional[float]) -> Callable[..., Any]:
    seconds = USER_CODE_TIMEOUT_S if timeout_s is None else timeout_s
    late = (
        f"posttrain: {label} did not return within {seconds:g} s ({key}); the job stops: make it return sooner, or "
        f"give it longer ({key})"
    )

    if is_async_callable(function):

        @functools.wraps(function)
        async def bounded_async(*args: Any, **kwargs: Any) -> Any:
            with deadline(seconds, late), _no_exit(label):
                return await function(*args, **kwargs)

        return bounded_async

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        with deadline(seconds, late), _no_exit(label):
            return function(*args, **kwargs)

    return bounded


@contextlib.contextmanager
def _no_exit(label: str) -> Iterator[None]:
    """A ``sys.exit`` in the block ends the job in one line naming ``label`` and the exit code."""
    try:
        yield
    except SystemExit as exit:
        stop_now(
            f"posttrain: {label} called sys.exit({exit.code!r}): the job stops; user code returns (or raises), it "
            "does not end the process"
        )


def _class_name(factory: Callable[..., Any]) -> str:
    """The class an environment's factory builds (a class, or a ``functools.partial`` of one)."""
    made = getattr(factory, "func", factory)
    return getattr(made, "__name__", type(made).__name__)
