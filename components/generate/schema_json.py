"""JSON Schemas of the specs, for editors: completion, hover text and errors while writing YAML.

One schema (draft 2020-12) per algorithm, built from what the validator
itself uses: the sections from the algorithm's pydantic spec class
(``registry.SPEC_CLASSES``), ``training`` and ``model.lora`` from the field
table (``config_fields.json``), so neither TRL nor PEFT is imported::

    python -m posttrain.components.generate.schema_json sft      # prints sft's schema
    python -m posttrain.components.generate.schema_json --all    # rewrites components/generated/schemas/*.schema.json

The files ship in the package; a test fails when they drift from the code.
The templates point the YAML language server at them with their first line::

    # yaml-language-server: $schema=../../components/generated/schemas/sft.schema.json

The schema checks what fields alone can say (keys, types, choices, the value
ranges, text forms and mapping keys of ``value_rules/``, ``training.output_dir``
required); rules across fields (``bf16`` with ``fp16``, the generation batch,
one reward source, values that do nothing with others) are still the validator's.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Type

from posttrain.components.generate.field_notes import FIELD_NOTES
from posttrain.components.spec.chain import ALGORITHM
from posttrain.components.spec.evaluation import EvalSpec
from posttrain.components.spec.fields import LORA_CONFIG, TABLE_PATH, FieldType, config_fields
from posttrain.components.spec.loading import BOOLEAN_WORDS, EXPONENT_NUMBER
from posttrain.components.spec.registry import SPEC_CLASSES
from posttrain.components.spec.schema import Spec
from posttrain.components.spec.sections import AgentSection
from posttrain.components.spec.values import Range, rows_for

DRAFT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_DIR = Path(__file__).resolve().parents[1] / "generated" / "schemas"

# The field table's kinds as JSON Schema types; "any" and "choice" are handled apart.
JSON_TYPES = {
    "bool": "boolean",
    "int": "integer",
    "float": "number",
    "list": "array",
    "dict": "object",
    "str": "string",
}


def field_schema(field: FieldType) -> Dict[str, Any]:
    """A field table entry as a JSON Schema.

    >>> field_schema(FieldType(("int",), nullable=True))
    {'type': ['integer', 'null']}
    >>> field_schema(FieldType(("choice",), choices=("linear", "cosine")))
    {'enum': ['linear', 'cosine']}
    >>> field_schema(FieldType(("bool", "choice"), choices=("all",)))
    {'anyOf': [{'type': 'boolean'}, {'enum': ['all']}]}
    >>> field_schema(FieldType(("any",), nullable=False))
    {}
    """
    # FieldType.check accepts any value for these
    if "any" in field.kinds:
        return {}
    types = [JSON_TYPES[kind] for kind in field.kinds if kind != "choice"]
    if field.nullable:
        types.append("null")
    typed = {"type": types[0] if len(types) == 1 else types}
    if field.choices is None:
        return typed
    if not types or types == ["null"]:
        return {"enum": list(field.choices) + ([None] if field.nullable else [])}
    # a list of choices (DPO's loss_type)
    if "list" in field.kinds:
        typed["items"] = {"enum": list(field.choices)}
    return {"anyOf": [typed, {"enum": list(field.choices)}]}


def table_schema(class_name: str, *, exclude: Sequence[str] = ()) -> Dict[str, Any]:
    """An object whose properties are one config class's fields, with their defaults and ranges; nothing else."""
    # the raw table: it says which defaults exist
    entries = json.loads(TABLE_PATH.read_text())[class_name]
    fields = config_fields(class_name)
    rows = rows_for(class_name, fields)
    ranges = {row["field"]: Range.parse(row["range"]) for row in rows if "range" in row}
    patterns = {row["field"]: row["pattern"] for row in rows if "pattern" in row}
    keys: Dict[str, List[str]] = {}
    for row in rows:
        keys.setdefault(row["field"], []).extend(row.get("keys", []))
    properties = {}
    for name, field in fields.items():
        if name in exclude:
            continue
        prop = field_schema(field)
        # the validator's ranges; they apply to numbers only, so null stays allowed
        if name in ranges:
            bounds = ranges[name]
            if bounds.low is not None:
                prop["minimum" if bounds.low_inclusive else "exclusiveMinimum"] = bounds.low
            if bounds.high is not None:
                prop["maximum" if bounds.high_inclusive else "exclusiveMaximum"] = bounds.high
        # constrains text only, so null stays allowed
        if name in patterns:
            prop["pattern"] = patterns[name]
        # the keys a mapping may hold under any condition; propertyNames constrains objects only
        if keys.get(name):
            prop["propertyNames"] = {"enum": sorted(set(keys[name]))}
        if "default" in entries[name]:
            prop["default"] = entries[name]["default"]
        notes = [entries[name].get("help", "")] + [
            row["reason"]
            for row in rows
            if row["field"] == name and any(kind in row for kind in ("range", "choices", "pattern"))
        ]
        prop["description"] = " ".join(f"{note[:1].upper()}{note[1:]}".rstrip(".") + "." for note in notes if note)
        properties[name] = _as_pyyaml_reads(prop, field)
    return {"type": "object", "properties": properties, "additionalProperties": False}


def _as_pyyaml_reads(prop: Dict[str, Any], field: FieldType) -> Dict[str, Any]:
    """A field's schema that also takes what PyYAML (YAML 1.1) reads otherwise than written, where the validator
    takes it as written (``spec.loading.as_written_by_yaml_1_1``): ``3e-3`` (text to PyYAML) for a number, ``no`` (false to
    PyYAML) for the choice. A user's own check, PyYAML then jsonschema, passes what posttrain passes."""
    also = []
    if "float" in field.kinds and "str" not in field.kinds:
        also.append({"type": "string", "pattern": EXPONENT_NUMBER.pattern})
    if field.choices and "bool" not in field.kinds:
        also += [{"const": value} for value, words in BOOLEAN_WORDS.items() if set(words) & set(field.choices)]
    if not also:
        return prop
    kept = {key: prop.pop(key) for key in ("description", "default") if key in prop}
    return {"anyOf": [prop, *also], **kept}


def training_schema(cls: Type[Spec]) -> Dict[str, Any]:
    """``training``: the TRL config's fields less the ones posttrain owns (those are errors, as in the validator)."""
    owned, refused = cls.owned_keys, cls.refused_keys
    schema = table_schema(cls.config_class, exclude=[*owned, *refused])
    pointers = "; ".join(f"{key}: {where}" for key, where in sorted({**owned, **refused}.items()))
    schema["description"] = f"Fields of {cls.config_class} (from config_fields.json). Not allowed here: {pointers}."
    schema["required"] = ["output_dir"]
    return schema


def lora_schema(cls: Type[Spec]) -> Dict[str, Any]:
    """``model.lora``: PEFT's LoraConfig fields."""
    schema = table_schema(LORA_CONFIG)
    schema["description"] = f"Fields of {LORA_CONFIG} (from config_fields.json); task_type defaults to {cls.lora_task}."
    return schema


def _strip_titles(node: Any) -> Any:
    """Drops pydantic's generated titles ("Name Or Path"): noise in hover text. Property names are kept."""
    if isinstance(node, list):
        return [_strip_titles(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "title":
            continue
        # maps of names: each value is a schema
        if key in ("properties", "$defs"):
            out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
        else:
            out[key] = _strip_titles(value)
    return out


def _describe(properties: Dict[str, Any], notes: Mapping[str, str]) -> None:
    for name, note in notes.items():
        if name in properties and "description" not in properties[name]:
            properties[name]["description"] = note
    # posttrain's own numbers (rewards[].weight): PyYAML reads 1e-3 as text
    for name, prop in properties.items():
        alternatives = prop.get("anyOf", [prop])
        if {"type": "number"} in alternatives or prop.get("type") == "number":
            number = {key: prop.pop(key) for key in list(prop) if key not in ("description", "default")}
            text = {"type": "string", "pattern": EXPONENT_NUMBER.pattern}
            prop["anyOf"] = [*number.get("anyOf", [number]), text]


def spec_schema(algorithm: str) -> Dict[str, Any]:
    """The JSON Schema of one algorithm's spec."""
    cls = SPEC_CLASSES[algorithm]
    generated = _strip_titles(cls.model_json_schema())
    defs = generated.get("$defs", {})
    properties = generated["properties"]
    properties["training"] = training_schema(cls)
    defs["ModelSpec"]["properties"]["lora"] = {
        "anyOf": [lora_schema(cls), {"type": "null"}],
        "default": None,
        "description": "LoRA adapters (PEFT LoraConfig fields) instead of full fine-tuning.",
    }
    if "rewards" in properties:
        # the validator asks for at least one
        properties["rewards"]["minItems"] = 1
    if issubclass(cls, AgentSection):
        # a verifiers environment's taskset is the data where the spec gives none (sections.with_taskset_rows)
        generated["required"].remove("data")
        verifiers = {"type": "object", "required": ["verifiers"], "description": "A verifiers environment."}
        generated["if"] = {"properties": {"environment": verifiers}, "required": ["environment"]}
        generated["else"] = {"required": ["data"]}
    _describe(properties, FIELD_NOTES[""])
    for name, notes in FIELD_NOTES.items():
        if name in defs:
            _describe(defs[name]["properties"], notes)
    return {
        "$schema": DRAFT,
        "title": f"posttrain {algorithm} spec",
        **generated,
    }


def eval_schema() -> Dict[str, Any]:
    """The JSON Schema of ``posttrain.eval``'s spec."""
    generated = _strip_titles(EvalSpec.model_json_schema())
    # an evaluation loads models as they are (the validator refuses an adapter and quantization)
    for refused in ("lora", "quantization"):
        del generated["$defs"]["ModelSpec"]["properties"][refused]
    _describe(generated["properties"], FIELD_NOTES["EvalSpec"])
    for name, notes in FIELD_NOTES.items():
        if name in generated.get("$defs", {}):
            _describe(generated["$defs"][name]["properties"], notes)
    return {"$schema": DRAFT, "title": "posttrain eval spec", **generated}


def chain_schema() -> Dict[str, Any]:
    """The JSON Schema of ``posttrain.chain``'s spec: each stage is checked as a spec of its own by the validator
    (its file, or its inline sections), so the schema holds the chain's own keys."""
    stage = {
        "type": "object",
        "description": "A stage: a spec written inline, or spec: <path> with sections of its own on top (a mapping "
        "merges key by key); ${stages.<name>.output} is an earlier stage's output directory.",
        "properties": {
            "spec": {"type": "string", "description": "A spec file, relative to the chain's file."},
        },
    }
    return {
        "$schema": DRAFT,
        "title": "posttrain chain spec",
        "type": "object",
        "properties": {
            "algorithm": {"const": ALGORITHM, "description": "chain: stages run one after another in one job."},
            "output_dir": {
                "type": "string",
                "description": "The chain's directory: stage <name> writes <output_dir>/<name>.",
            },
            "stages": {
                "type": "object",
                "description": "Named stages (lowercase letters, digits and _), in the order they run.",
                "minProperties": 1,
                "additionalProperties": stage,
            },
        },
        "required": ["algorithm", "output_dir", "stages"],
        "additionalProperties": False,
    }


# the schemas besides the algorithms': posttrain.eval's and posttrain.chain's specs
OTHER_SCHEMAS: Dict[str, Callable[[], Dict[str, Any]]] = {"eval": eval_schema, "chain": chain_schema}
# every schema, by the algorithm a spec names
SCHEMA_NAMES = sorted([*SPEC_CLASSES, *OTHER_SCHEMAS])


def render(algorithm: str) -> str:
    """The canonical text of ``schemas/<algorithm>.schema.json`` (``eval`` and ``chain`` too)."""
    schema = OTHER_SCHEMAS[algorithm]() if algorithm in OTHER_SCHEMAS else spec_schema(algorithm)
    return json.dumps(schema, indent=1) + "\n"


def schema_path(algorithm: str, directory: Path = SCHEMA_DIR) -> Path:
    return directory / f"{algorithm}.schema.json"


def write_each_algorithm(render_one: Callable[[str], str], path_of: Callable[[str], Path]) -> List[Path]:
    """Writes one generated file per algorithm (a schema, a reference page); returns the paths written."""
    written = []
    for algorithm in sorted(SPEC_CLASSES):
        path = path_of(algorithm)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_one(algorithm))
        written.append(path)
    return written


def write_all(directory: Path = SCHEMA_DIR) -> List[Path]:
    """Writes every schema into ``directory`` (each algorithm's, the eval's and the chain's); returns the paths
    written."""
    written = write_each_algorithm(render, lambda algorithm: schema_path(algorithm, directory))
    for name in OTHER_SCHEMAS:
        path = schema_path(name, directory)
        path.write_text(render(name))
        written.append(path)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m posttrain.components.generate.schema_json", description="JSON Schemas of posttrain's specs."
    )
    parser.add_argument("algorithm", nargs="?", choices=SCHEMA_NAMES, help="print this algorithm's schema")
    parser.add_argument(
        "--all",
        nargs="?",
        const=SCHEMA_DIR,
        type=Path,
        metavar="DIR",
        help=f"write <algorithm>.schema.json for every algorithm into DIR (default {SCHEMA_DIR})",
    )
    args = parser.parse_args(argv)
    if (args.algorithm is None) == (args.all is None):
        parser.error("give an algorithm or --all")
    if args.all is not None:
        for path in write_all(args.all):
            print(f"wrote {path}")
    else:
        sys.stdout.write(render(args.algorithm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
