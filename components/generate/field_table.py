"""``config_fields.json``, generated from the installed trl, peft and transformers (imports them)::

    python -m posttrain.components.generate.field_table   # rewrites config_fields.json

The table holds every field of the registry's config classes and PEFT's
``LoraConfig`` (types, choices, JSON defaults, help), widened by the
value rules' documented kinds and choices. A test regenerates it in memory
and fails when it drifts from the installed packages.
"""

import dataclasses
import enum
import importlib
import json
import os
import re
import typing
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from posttrain.components.spec.fields import KINDS, LORA_CONFIG, TABLE_PATH, field_type
from posttrain.components.spec.registry import SPEC_CLASSES
from posttrain.components.spec.values import rows_for

_NO_DEFAULT = object()
# TRL's advice that names a key posttrain refuses, and what holds in posttrain instead
_REROUTED = {
    'use `model_init_kwargs={"use_kernels": True}` instead': "posttrain keeps this key, as it refuses "
    "`model_init_kwargs` (it loads the models itself)",
}


def help_text(text: str) -> str:
    """A package's help text as the table keeps it: argparse's ``%%`` as ``%``, an HTML link as Markdown's (the
    reference pages and the schemas' hover text show it), and no advice to use a key posttrain refuses.

    >>> help_text("~20%% slower; see <a href='https://x.org/p'>the paper</a>")
    '~20% slower; see [the paper](https://x.org/p)'
    >>> help_text('Deprecated: use `model_init_kwargs={"use_kernels": True}` instead.')
    'Deprecated: posttrain keeps this key, as it refuses `model_init_kwargs` (it loads the models itself).'
    """
    text = text.replace("%%", "%")
    for advice, instead in _REROUTED.items():
        text = text.replace(advice, instead)
    return re.sub(r"""<a href=['"]([^'"]+)['"]>(.*?)</a>""", r"[\2](\1)", text)


def config_classes() -> List[str]:
    """The classes whose fields the table holds, as ``module:Class`` import paths."""
    return sorted({cls.config_class for cls in SPEC_CLASSES.values()} | {LORA_CONFIG})


def fields_of_class(cls: type) -> Dict[str, Dict[str, Any]]:
    """The init fields of a dataclass: their FieldType as JSON, and their default where JSON can hold it."""
    hints = typing.get_type_hints(cls)
    described = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        entry = field_type(hints[f.name]).to_json()
        # TRL's own list of valid values
        if f.metadata.get("choices") and entry["choices"] is None:
            entry["choices"] = list(f.metadata["choices"])
            entry["kinds"] = [kind if kind != "str" else "choice" for kind in entry["kinds"]]
        default = _json_default(f)
        if default is not _NO_DEFAULT:
            entry["default"] = default
        # the package's own help text: the schemas' hover text and the spec reference
        if f.metadata.get("help"):
            entry["help"] = help_text(" ".join(str(f.metadata["help"]).split()))
        described[f.name] = entry
    return described


def _json_default(f: "dataclasses.Field[Any]") -> Any:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return _NO_DEFAULT
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return _NO_DEFAULT


def generate_table() -> Dict[str, Dict[str, Dict[str, Any]]]:
    """Builds the table from the installed packages (imports trl and peft)."""
    # ORPO lives in trl.experimental
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    table = {}
    for target in config_classes():
        module_name, _, attr = target.partition(":")
        fields = fields_of_class(getattr(importlib.import_module(module_name), attr))
        # what TRL documents beyond its annotations
        for row in rows_for(target, fields):
            _widen(fields[row["field"]], row.get("also", []), row.get("choices"))
        table[target] = dict(sorted(fields.items()))
    return table


def _widen(entry: Dict[str, Any], also: List[str], choices: Optional[List[Any]]) -> None:
    """Adds the kinds and the documented choices of a value-rules row to a field's table entry."""
    kinds = list(entry["kinds"]) + [kind for kind in also if kind not in entry["kinds"]]
    if choices is not None:
        entry["choices"] = list(choices)
        kinds = [kind if kind != "str" else "choice" for kind in kinds]
    entry["kinds"] = [kind for kind in KINDS + ("choice",) if kind in kinds]


def render_table(table: Mapping[str, Any]) -> str:
    """The canonical text of config_fields.json."""
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


def write() -> Path:
    """Rewrites config_fields.json from the installed packages; returns its path."""
    TABLE_PATH.write_text(render_table(generate_table()))
    return TABLE_PATH


if __name__ == "__main__":
    print(f"wrote {write()}")
