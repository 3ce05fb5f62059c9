"""How spec problems are worded: one line each, naming the dotted key.

Every problem says the key's dotted path, what was expected and, for an
unknown key, the nearest valid one::

    training.learnig_rate: unknown key; did you mean training.learning_rate?
"""

import difflib
import typing
from typing import Any, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Type

from pydantic import BaseModel, ValidationError


class SpecError(ValueError):
    """A spec, an override or a component argument is invalid.

    ``problems`` lists every problem found, one line each; ``str(error)`` is
    them joined by newlines. In the job, ``this_rank_only`` marks a problem
    one rank may meet without the others (a model that fails to load on one
    node): that rank says it, where rank 0 says the ones every rank shares.
    """

    def __init__(self, problems: Sequence[str], *, this_rank_only: bool = False) -> None:
        self.problems = list(problems)
        self.this_rank_only = this_rank_only
        super().__init__("\n".join(self.problems))


def first_line(error: BaseException) -> str:
    """An exception's message, one line: its first non-empty one, else its type."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def models_in(annotation: Any) -> List[Type[BaseModel]]:
    """The pydantic models an annotation holds (``X``, ``Optional[X]``, ``List[X]``, ``Union[X, Y]``)."""
    return [
        arg
        for arg in (annotation,) + typing.get_args(annotation)
        if isinstance(arg, type) and issubclass(arg, BaseModel)
    ]


def model_in(annotation: Any, keys: Iterable[str] = ()) -> Optional[Type[BaseModel]]:
    """The pydantic model an annotation holds, if any; of a Union's, the one whose fields hold most of ``keys``
    (the keys a section was written with), the first where they tie."""
    models = models_in(annotation)
    if not models:
        return None
    given = set(keys)
    return max(models, key=lambda model: len(given & set(model.model_fields)))


def named_model_in(annotation: Any) -> Optional[Type[BaseModel]]:
    """The pydantic model of sections by name an annotation allows (``Dict[str, X]``, among a Union's), if any."""
    for arg in (annotation,) + typing.get_args(annotation):
        if typing.get_origin(arg) is dict and len(typing.get_args(arg)) == 2:
            return model_in(typing.get_args(arg)[1])
    return None


def known_paths(model: Type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every dotted key of a pydantic model, sections included."""
    for name, field in model.model_fields.items():
        yield f"{prefix}{name}"
        for inner in models_in(field.annotation):
            yield from known_paths(inner, f"{prefix}{name}.")


def unknown_in(raw: Mapping[str, Any], model: Type[BaseModel], prefix: str, paths: List[str]) -> Iterator[str]:
    """Unknown keys of ``raw`` against a pydantic model, recursively, each with the nearest valid key."""
    for key, value in raw.items():
        path = f"{prefix}{key}"
        field = model.model_fields.get(key)
        if field is None:
            yield unknown_message(path, set(model.model_fields), prefix, paths)
            continue
        keys = value if isinstance(value, dict) else {}
        inner, named = model_in(field.annotation, keys), named_model_in(field.annotation)
        kinds = models_in(field.annotation)
        # sections by name (environment: {a: {...}, b: {...}}): none of the keys is any kind of the section's own
        if (
            named is not None
            and isinstance(value, dict)
            and not set(value) & {k for m in kinds for k in m.model_fields}
        ):
            for name, item in value.items():
                if isinstance(item, dict):
                    yield from unknown_in(item, named, f"{path}.{name}.", paths)
        elif inner is not None and isinstance(value, dict):
            # keys of two kinds of the section (environment: factory and verifiers)
            other = [k for k in value if k not in inner.model_fields and any(k in m.model_fields for m in kinds)]
            own = [k for k in value if k in inner.model_fields and not all(k in m.model_fields for m in kinds)]
            if other and own:
                yield f"{path}: {own[0]} and {other[0]} are keys of two kinds of {key}; give the keys of one"
                continue
            yield from unknown_in(value, inner, f"{path}.", paths)
        elif inner is not None and isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, dict):
                    yield from unknown_in(item, inner, f"{path}.{index}.", paths)


def unknown_mapping_keys(raw: Mapping[str, Any], allowed: Set[str], prefix: str, paths: List[str]) -> Iterator[str]:
    """Unknown keys of a free mapping (``training``, ``model.lora``) checked against a field table."""
    for key in raw:
        if key not in allowed:
            yield unknown_message(f"{prefix}.{key}", allowed, f"{prefix}.", paths)


# How much of a value or key a user wrote a message echoes: enough to recognise it, never a wall of text
ECHO_CHARS = 80


def cut(text: str) -> str:
    """``text`` as a message echoes it: whole up to ECHO_CHARS, else its start and how long it was.

    >>> cut("x" * 200)
    'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... (200 characters)'
    """
    return text if len(text) <= ECHO_CHARS else f"{text[:ECHO_CHARS]}... ({len(text)} characters)"


def unknown_message(path: str, siblings: Set[str], prefix: str, paths: List[str]) -> str:
    """``path: unknown key``, with the nearest sibling, else where the key belongs, else the valid keys.

    >>> unknown_message("training.learnig_rate", {"learning_rate", "seed"}, "training.", [])
    'training.learnig_rate: unknown key; did you mean training.learning_rate?'
    >>> unknown_message("lora", {"model", "data"}, "", ["model.lora"])
    'lora: unknown key here; it belongs at model.lora'
    """
    key = path[len(prefix) :]
    path = prefix + cut(key)
    close = difflib.get_close_matches(key, sorted(siblings), n=1, cutoff=0.6)
    if close:
        return f"{path}: unknown key; did you mean {prefix}{close[0]}?"
    # the nearest place of that name: under most of this key's own sections, then the least deep
    named = (p for p in paths if p.rsplit(".", 1)[-1] == key)
    elsewhere = sorted(named, key=lambda p: (-_shared_sections(p, prefix), p.count(".")))
    if elsewhere:
        return f"{path}: unknown key here; it belongs at {elsewhere[0]}"
    if len(siblings) <= 8:
        return f"{path}: unknown key; valid keys here: {', '.join(sorted(siblings))}"
    nearest = difflib.get_close_matches(key, sorted(siblings), n=5, cutoff=0)
    return f"{path}: unknown key; the nearest of the {len(siblings)} valid keys here: {', '.join(nearest)}"


def _shared_sections(path: str, prefix: str) -> int:
    """How many leading sections ``path`` shares with ``prefix`` (``evaluate.generation.seed`` with ``evaluate.``:
    one)."""
    shared = 0
    for mine, theirs in zip(path.split("."), prefix.split(".")):
        if mine != theirs:
            break
        shared += 1
    return shared


def translate(error: ValidationError) -> List[str]:
    """pydantic's errors as spec problems (unknown keys are reported by :func:`unknown_in` instead)."""
    found = []
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"]) or "spec"
        if item["type"] == "missing":
            found.append(f"{path}: required")
        elif item["type"] == "extra_forbidden":
            continue
        else:
            message = item["msg"][:1].lower() + item["msg"][1:]
            found.append(f"{path}: {message}; got {cut(repr(item['input']))}")
    return found
