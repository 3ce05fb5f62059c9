"""The spec reference of the documentation site: one page per algorithm, generated from what the validator uses.

First the algorithm's description (``spec/descriptions.py``, the text of its
component's ``--help`` too), then every key of a spec with its type, default,
range or choices and help text: posttrain's own sections from the JSON Schema of the spec class
(``schema_json``, itself built from the pydantic models), ``training`` and
``model.lora`` from the field table (``config_fields.json``: TRL's,
transformers' and PEFT's types, defaults and help) with the value rules
(``value_rules/``), and the ``training`` keys posttrain refuses with the reason::

    python -m posttrain.components.generate.reference --all   # rewrites docs/pages/reference/*.md

A test fails when the pages drift from the code.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from posttrain.components.generate.schema_json import spec_schema, write_each_algorithm
from posttrain.components.spec.descriptions import DESCRIPTIONS, FAST_PATH_DEFAULTS, facts
from posttrain.components.spec.fields import LORA_CONFIG, TABLE_PATH, config_fields
from posttrain.components.spec.registry import SPEC_CLASSES
from posttrain.components.spec.values import rows_for

PAGES_DIR = Path(__file__).resolve().parents[2] / "docs" / "pages" / "reference"


def _markdown(text: str) -> str:
    """reST's literals as Markdown's, angle brackets escaped."""
    parts = text.replace("``", "`").split("`")
    # outside code spans only: inside one, Markdown shows an entity as written
    return "`".join(part if i % 2 else part.replace("<", "&lt;").replace(">", "&gt;") for i, part in enumerate(parts))


def _cell(text: Any) -> str:
    """Text as one Markdown table cell: one line, pipes escaped, in Markdown (:func:`_markdown`)."""
    return _markdown(" ".join(str(text).split()).replace("|", "\\|"))


def _description(algorithm: str) -> List[str]:
    """The page's section from the algorithm's description: the text its component's ``--help`` shows."""
    text = DESCRIPTIONS[algorithm]
    lines = ["## What it does", "", _markdown(text.summary), "", _markdown(text.use), ""]
    lines += [f"- **{label}**: {_markdown(line)}" for label, line in facts(algorithm)]
    # inline, not a ```shell block: tests/e2e/test_readme.py runs those in one directory, where these clash
    # (a second sft tiny run finds the first's finished model)
    return lines + ["", "Examples:", ""] + [f"- `{command}`" for command in text.examples]


def _shown(value: Any) -> str:
    return f"`{json.dumps(value)}`"


def _schema_type(prop: Dict[str, Any]) -> str:
    """A JSON Schema property's type, as the reference says it."""
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "enum" in prop:
        return "one of " + ", ".join(f"`{json.dumps(choice)}`" for choice in prop["enum"])
    if "$ref" in prop:
        return "section: " + prop["$ref"].rsplit("/", 1)[1]
    if "anyOf" in prop:
        kinds = [_schema_type(option) for option in prop["anyOf"]]
        return " or ".join(kind for kind in kinds if not kind.startswith("text written"))
    kind = prop.get("type", "any")
    if kind == "string" and "pattern" in prop:
        return "text written as a number (YAML 1.1)"
    if kind == "array":
        return f"list of {_schema_type(prop.get('items', {}))}"
    return "object" if kind == "object" and "properties" not in prop else str(kind)


def _section_table(
    properties: Dict[str, Any], required: Sequence[str], prefix: str, posttrain_defaults: Mapping[str, str] = {}
) -> List[str]:
    rows = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    for name, prop in properties.items():
        default = "required" if name in required else (_shown(prop["default"]) if "default" in prop else "")
        if prefix + name in posttrain_defaults:
            default = f"posttrain: {posttrain_defaults[prefix + name]}"
        rows.append(
            f"| `{prefix}{name}` | {_cell(_schema_type(prop))} | {_cell(default)} | {_cell(prop.get('description', ''))} |"
        )
    return rows


def _field_table(
    class_name: str, prefix: str, exclude: Sequence[str] = (), posttrain_defaults: Mapping[str, str] = {}
) -> List[str]:
    """A config class's fields: type, default (posttrain's where the job decides it, with the package's beside),
    what posttrain allows beyond the type, and the package's help."""
    entries = json.loads(TABLE_PATH.read_text())[class_name]
    fields = config_fields(class_name)
    rules: Dict[str, List[str]] = {}
    for row in rows_for(class_name, fields):
        if "range" in row:
            rules.setdefault(row["field"], []).append(f"{row['range'].replace('x', row['field'])} ({row['reason']})")
        elif "choices" in row:
            rules.setdefault(row["field"], []).append(f"one of {', '.join(map(str, row['choices']))} ({row['reason']})")
    rows = ["| key | type | default | allowed | description |", "| --- | --- | --- | --- | --- |"]
    for name, field in fields.items():
        if name in exclude:
            continue
        entry = entries[name]
        default = _shown(entry["default"]) if "default" in entry else ""
        if prefix + name in posttrain_defaults:
            default = f"posttrain: {posttrain_defaults[prefix + name]} (TRL: {default})"
        rows.append(
            f"| `{prefix}{name}` | {_cell(field.describe())} | {_cell(default)} | "
            f"{_cell('; '.join(rules.get(name, [])))} | {_cell(entry.get('help', ''))} |"
        )
    return rows


def render(algorithm: str) -> str:
    """The reference page of one algorithm's spec."""
    cls = SPEC_CLASSES[algorithm]
    schema = spec_schema(algorithm)
    defs = schema.get("$defs", {})
    lines = [
        f"# `posttrain.{algorithm}` spec reference",
        "",
        "Generated (`python -m posttrain.components.generate`) from the algorithm's description "
        "(`components/spec/descriptions.py`) and the field tables the validator uses.",
        "",
        *_description(algorithm),
        "",
        "## Top level",
        "",
    ]
    # what the job decides where the spec leaves a key unset, by the key's path
    decided = {key: text for path in cls.fast_paths for key, text in FAST_PATH_DEFAULTS[path].items()}
    decided.update(
        {f"training.{key}": f"{_shown(value)}, set by posttrain" for key, value in cls.config_defaults.items()}
    )
    top = {name: prop for name, prop in schema["properties"].items() if name != "training"}
    lines += _section_table(top, schema.get("required", []), "")
    for name, prop in top.items():
        ref = prop.get("$ref") or next((o["$ref"] for o in prop.get("anyOf", []) if "$ref" in o), None)
        ref = ref or (prop.get("items", {}).get("$ref") if prop.get("type") == "array" else None)
        if ref is None:
            continue
        section = defs[ref.rsplit("/", 1)[1]]
        # model.lora has a section of its own below; a section the algorithm refuses has none
        inner = {
            key: value
            for key, value in section["properties"].items()
            if key != "lora" and f"{name}.{key}" not in cls.refused_sections
        }
        # each item of a list: rewards[].weight
        name = f"{name}[]" if prop.get("type") == "array" else name
        lines += ["", f"## `{name}`", "", _cell(section.get("description", "")), ""]
        lines += _section_table(inner, section.get("required", []), f"{name}.", decided)
        # a section within (data.train, data.eval, distributed.deepspeed)
        for key, value in inner.items():
            nested = value.get("$ref") or next((o["$ref"] for o in value.get("anyOf", []) if "$ref" in o), None)
            if nested is not None and nested.rsplit("/", 1)[1] != ref.rsplit("/", 1)[1]:
                sub = defs[nested.rsplit("/", 1)[1]]
                listed = any(o.get("type") == "array" for o in value.get("anyOf", []))
                each = f" (in a list, each item: `{name}.{key}.0`, `{name}.{key}.1`, ...)" if listed else ""
                lines += ["", f"### `{name}.{key}`{each}", "", _cell(sub.get("description", "")), ""]
                lines += _section_table(sub["properties"], sub.get("required", []), f"{name}.{key}.")
    refused = {**cls.owned_keys, **cls.refused_keys}
    lines += [
        "",
        "## `training`",
        "",
        f"The fields of `{cls.config_class}`, as the installed TRL defines them; `training.output_dir` is required.",
        "",
    ]
    lines += _field_table(cls.config_class, "training.", exclude=list(refused), posttrain_defaults=decided)
    lines += ["", "### Keys posttrain refuses in `training`", "", "| key | why, and what to use |", "| --- | --- |"]
    lines += [f"| `training.{key}` | {_cell(why)} |" for key, why in sorted(refused.items())]
    if cls.refused_sections:
        lines += ["", "### Sections posttrain refuses", "", "| section | why |", "| --- | --- |"]
        lines += [f"| `{key}` | {_cell(why)} |" for key, why in sorted(cls.refused_sections.items())]
    if "model.lora" not in cls.refused_sections:
        lines += [
            "",
            "## `model.lora`",
            "",
            f"LoRA adapters: the fields of `{LORA_CONFIG}`; `task_type` defaults to `{cls.lora_task}`.",
            "",
        ]
        lines += _field_table(LORA_CONFIG, "model.lora.")
    return "\n".join(lines) + "\n"


def page_path(algorithm: str, directory: Path = PAGES_DIR) -> Path:
    return directory / f"{algorithm}.md"


def render_choosing() -> str:
    """The page that sets the algorithms side by side: what each is, when to use it, and what it reads, from their
    descriptions (the text of their ``--help`` and reference pages)."""
    lines = [
        "# Choosing an algorithm",
        "",
        "Generated (`python -m posttrain.components.generate`) from the algorithms' descriptions "
        "(`components/spec/descriptions.py`), the text of each component's `--help` and reference page. The data "
        "each reads: [Your own data](../your-data.md).",
        "",
        "| algorithm | what it is | when to use it | what it reads |",
        "| --- | --- | --- | --- |",
    ]
    for algorithm in sorted(SPEC_CLASSES):
        text = DESCRIPTIONS[algorithm]
        lines.append(
            f"| [`posttrain.{algorithm}`]({algorithm}.md) | {_cell(text.summary)} | {_cell(text.use)} | "
            f"{_cell(text.data)} |"
        )
    return "\n".join(lines) + "\n"


CHOOSING_PATH = PAGES_DIR / "index.md"


def write_all() -> List[Path]:
    """Writes every algorithm's page, and the page that sets them side by side, into PAGES_DIR; returns the paths
    written."""
    CHOOSING_PATH.write_text(render_choosing())
    return [*write_each_algorithm(render, page_path), CHOOSING_PATH]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m posttrain.components.generate.reference", description=__doc__.splitlines()[0]
    )
    parser.add_argument("algorithm", nargs="?", choices=sorted(SPEC_CLASSES), help="print this algorithm's page")
    parser.add_argument("--all", action="store_true", help=f"write every algorithm's page into {PAGES_DIR}")
    args = parser.parse_args(argv)
    if (args.algorithm is None) == (not args.all):
        parser.error("give an algorithm or --all")
    if args.all:
        for path in write_all():
            print(f"wrote {path}")
    else:
        sys.stdout.write(render(args.algorithm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
