"""Field types of the config classes a spec hands its sections to.

``training`` goes to a TRL config class (``SFTConfig``, ``DPOConfig``, ...) and
``model.lora`` to PEFT's ``LoraConfig``. The client must check those keys at
submit time without importing trl (``--dryrun`` and ``torchx builtins`` stay
fast), so ``config_fields.json`` holds a table of every field's accepted types,
generated from the installed packages by ``field_table.py``::

    python -m posttrain.components.generate.field_table   # rewrites config_fields.json

A test regenerates the table in memory and fails when it drifts from the
installed trl/peft/transformers.

The same :class:`FieldType` describes the fields of the spec's own pydantic
models, so overrides (``key.path=value``) convert by one rule everywhere.
"""

import dataclasses
import difflib
import enum
import functools
import json
import types
import typing
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import yaml

TABLE_PATH = Path(__file__).resolve().parents[1] / "generated" / "config_fields.json"

# PEFT's LoraConfig: ``model.lora``'s fields. The algorithms' config classes are the registry's.
LORA_CONFIG = "peft:LoraConfig"


# Kinds a value can have, in the order an override's text is tried against them.
KINDS = ("bool", "int", "float", "list", "dict", "str", "any")


@dataclasses.dataclass(frozen=True)
class FieldType:
    """What a field accepts: a set of kinds, optionally a closed set of choices.

    >>> FieldType(("int",), nullable=True).check(None)
    >>> FieldType(("int",)).check(True)
    'expected an integer; got True'
    >>> FieldType(("choice",), choices=("linear", "cosine")).check("cosin")
    "expected one of 'linear', 'cosine'; got 'cosin'; did you mean 'cosine'?"
    """

    kinds: Tuple[str, ...]
    nullable: bool = False
    choices: Optional[Tuple[Any, ...]] = None

    def check(self, value: Any) -> Optional[str]:
        """Returns what is wrong with ``value`` for this field, or None."""
        if value is None:
            return None if self.nullable else f"expected {self.describe()}; got null"
        if self.choices is not None and value in self.choices:
            return None
        if self.choices is not None and isinstance(value, list) and "list" in self.kinds:
            # a list of choices (DPO's loss_type)
            wrong = [item for item in value if item not in self.choices]
            return f"expected items from {self.describe()}; got {wrong[0]!r}" if wrong else None
        if any(_is_kind(value, kind) for kind in self.kinds if kind != "choice"):
            return None
        problem = f"expected {self.describe()}; got {value!r}"
        if self.choices is not None and isinstance(value, str):
            close = difflib.get_close_matches(value, [str(c) for c in self.choices], n=1)
            if close:
                problem += f"; did you mean {close[0]!r}?"
        return problem

    def describe(self) -> str:
        """A short human description, e.g. 'an integer or null'."""
        names = {
            "bool": "true/false",
            "int": "an integer",
            "float": "a number",
            "list": "a list",
            "dict": "a mapping",
            "str": "a string",
            "any": "any value",
        }
        parts = [names[k] for k in self.kinds if k != "choice"]
        if self.choices is not None:
            shown = ", ".join(repr(c) for c in self.choices)
            parts.insert(0, f"one of {shown}")
        if self.nullable:
            parts.append("null")
        return " or ".join(parts)

    def convert(self, text: str) -> Any:
        """Converts an override's text to the value it means for this field.

        A string field keeps the text exactly; numbers, booleans, lists and
        mappings are read as YAML flow syntax. Text that fits no kind is kept
        as it is, so validation reports it with the field's expectation.

        >>> FieldType(("float",)).convert("1e-5")
        1e-05
        >>> FieldType(("str",)).convert("it's 'quoted'")
        "it's 'quoted'"
        >>> FieldType(("list", "str"), nullable=True).convert("[q_proj, v_proj]")
        ['q_proj', 'v_proj']
        """
        if self.nullable and text in ("null", "~", "None"):
            return None
        if self.choices is not None and text in [str(c) for c in self.choices]:
            return next(c for c in self.choices if str(c) == text)
        for kind in self.kinds:
            converted = _convert(text, kind)
            if converted is not _NO_MATCH:
                return converted
        return text

    def to_json(self) -> Dict[str, Any]:
        return {"kinds": list(self.kinds), "nullable": self.nullable, "choices": self.choices}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "FieldType":
        choices = data.get("choices")
        return cls(tuple(data["kinds"]), bool(data["nullable"]), tuple(choices) if choices is not None else None)


_NO_MATCH = object()


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "list":
        return isinstance(value, list)
    if kind == "dict":
        return isinstance(value, dict)
    if kind == "str":
        return isinstance(value, str)
    return kind == "any"


def _convert(text: str, kind: str) -> Any:
    if kind == "str":
        return text
    if kind == "bool":
        lowered = text.strip().lower()
        return {"true": True, "false": False}.get(lowered, _NO_MATCH)
    if kind in ("int", "float"):
        try:
            number = float(text) if kind == "float" else int(text)
        except ValueError:
            return _NO_MATCH
        return number
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError:
        return _NO_MATCH
    if kind == "any" or _is_kind(parsed, kind):
        return parsed
    return _NO_MATCH


def field_type(annotation: Any) -> FieldType:
    """Describes a type annotation (dataclass or pydantic field) as a FieldType.

    >>> field_type(Optional[int])
    FieldType(kinds=('int',), nullable=True, choices=None)
    >>> field_type(typing.Literal["auto", "bfloat16"])
    FieldType(kinds=('choice',), nullable=False, choices=('auto', 'bfloat16'))
    """
    kinds: List[str] = []
    choices: List[Any] = []
    nullable = False
    has_choices = False
    for arg in _union_members(annotation):
        if arg is type(None):
            nullable = True
        elif typing.get_origin(arg) is typing.Literal:
            has_choices = True
            for choice in typing.get_args(arg):
                if choice is None:
                    nullable = True
                else:
                    choices.append(choice)
        elif isinstance(arg, type) and issubclass(arg, enum.Enum):
            has_choices = True
            choices.extend(member.value for member in arg)
        else:
            kinds.append(_kind_of(arg))
    # `Union[str, SomeEnum]` (HF's idiom) accepts the enum's values only.
    if has_choices and set(kinds) <= {"str"}:
        kinds = ["choice"]
    elif has_choices:
        kinds.append("choice")
    ordered = tuple(k for k in KINDS + ("choice",) if k in kinds)
    unique_choices = tuple(dict.fromkeys(choices)) if has_choices else None
    return FieldType(ordered, nullable, unique_choices)


def _union_members(annotation: Any) -> Tuple[Any, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _kind_of(annotation: Any) -> str:
    origin = typing.get_origin(annotation) or annotation
    if origin is bool:
        return "bool"
    if origin is int:
        return "int"
    if origin is float:
        return "float"
    if origin is str:
        return "str"
    if origin in (list, tuple, set, typing.List, typing.Tuple):
        return "list"
    if origin in (dict, typing.Dict, Mapping):
        return "dict"
    return "any"


@functools.lru_cache(maxsize=None)
def _table() -> Dict[str, Dict[str, Dict[str, Any]]]:
    return json.loads(TABLE_PATH.read_text())


@functools.lru_cache(maxsize=None)
def config_fields(class_name: str) -> Dict[str, FieldType]:
    """The fields of one config class, by import path (``"trl:SFTConfig"``, ``LORA_CONFIG``, ...)."""
    return {field: FieldType.from_json(entry) for field, entry in _table()[class_name].items()}


def config_default(class_name: str, field: str) -> Any:
    """A field's default value (None where it has none JSON can hold)."""
    return _table()[class_name][field].get("default")


def config_value(class_name: str, values: Mapping[str, Any], field: str) -> Any:
    """A field's value in ``values`` (a spec's ``training``), else the config class's default."""
    return values[field] if field in values else config_default(class_name, field)
