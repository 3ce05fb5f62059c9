"""Loading a spec: one validated YAML document describing a training run.

The client validates it (so ``--dryrun`` and submission fail before anything
is scheduled), embeds it in the job as canonical JSON, and the job validates
it again with the same models before loading any model (docs/pages/design.md, "The spec").
The whole document is ``schema.Spec``: its sections in ``sections.py``,
``generation.py`` and ``judging.py``, its families in ``families.py``, the
algorithms in ``registry.py``, the wording of problems in ``messages.py``.
"""

import json
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Type

import yaml
from pydantic import BaseModel, ValidationError

from posttrain.components.spec.fields import LORA_CONFIG, FieldType, config_fields, field_type
from posttrain.components.spec.messages import (
    SpecError,
    cut,
    known_paths,
    model_in,
    translate,
    unknown_in,
    unknown_mapping_keys,
)
from posttrain.components.spec.overrides import apply_overrides
from posttrain.components.spec.registry import SPEC_CLASSES
from posttrain.components.spec.schema import Spec
from posttrain.components.spec.sections import AgentSection, with_taskset_rows
from posttrain.components.spec.shipped import SHIPPED_PREFIX, is_shipped, shipped_paths, spec_file, template_file
from posttrain.components.spec.values import (
    combination_problems,
    finite_problems,
    key_problems,
    length_problems,
    pattern_problems,
    range_problems,
    unused_problems,
)


def load_spec(
    path: str,
    overrides: Sequence[str] = (),
    *,
    algorithm: Optional[str] = None,
    world_size: Optional[int] = None,
) -> Spec:
    """Reads a YAML spec (a path, or a shipped template's name: ``sft/tiny``), applies ``key.path=value``
    overrides and validates it."""
    raw = read_yaml(spec_file(path))
    as_written_by_yaml_1_1(raw)
    return validate(apply_overrides(raw, overrides, algorithm), algorithm=algorithm, world_size=world_size)


def read_yaml(path: str, where: str = "--spec") -> Dict[str, Any]:
    """A spec file's mapping, as written but for a shipped template's paths to its shipped files, which name the
    installed ones (``shipped.py``); ``where`` names what pointed at it in the one-line errors."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise SpecError([f"{where}: no such file: {path}{_template_hint(path) if where == '--spec' else ''}"]) from None
    except OSError as e:
        raise SpecError([f"{where}: cannot read {path}: {e.strerror}"]) from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 -- a SafeLoader that refuses repeated keys
    except yaml.MarkedYAMLError as e:
        # one line: what and where
        mark = e.problem_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise SpecError([f"{where}: {path} is not valid YAML{at}: {e.problem or e.context}"]) from None
    except yaml.YAMLError as e:
        raise SpecError([f"{where}: {path} is not valid YAML: {e}"]) from None
    if not isinstance(raw, dict):
        raise SpecError([f"{where}: {path} must hold a mapping of sections (model, data, training, ...)"])
    return shipped_paths(raw) if is_shipped(path) else raw


def _template_hint(path: str) -> str:
    """--spec takes a template's name too: the name of the template a checkout's path names (an installed
    posttrain has no templates/ where the user runs), or where the names are listed."""
    name = path.removeprefix(SHIPPED_PREFIX).removesuffix(".yaml")
    if name != path and template_file(name) is not None:
        return f"; the shipped template of that path is --spec {name}"
    if path.endswith((".yaml", ".yml")):
        return ""
    return ", nor a template's name (posttrain templates ls lists them)"


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error, not the last one silently."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {cut(repr(key))} is given twice in one mapping (YAML would keep the last)",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 reads 1e-5 (no dot) as a string; 1.0e-5 is a float
EXPONENT_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")
# the words YAML 1.1 reads as booleans besides true and false
BOOLEAN_WORDS = {False: ("no", "off"), True: ("yes", "on")}


def as_written_by_yaml_1_1(raw: Dict[str, Any], schema: Optional[Type[BaseModel]] = None) -> None:
    """What YAML 1.1 read otherwise than written, as the field takes it: ``1e-5`` is a number where a field takes a
    number and not text; ``no`` is the choice ``'no'`` where a field takes choices and not a boolean
    (``eval_strategy: no``). ``schema``: a spec that is no algorithm's (an evaluation's), read by its own fields."""
    if schema is not None:
        _read_model_sections(raw, schema)
        return
    cls = SPEC_CLASSES.get(raw.get("algorithm"))  # type: ignore[arg-type]
    # posttrain's own fields: rewards[].weight, ...
    _read_model_sections(raw, cls or Spec)
    sections = [(raw.get("training"), cls.config_class if cls else None)]
    if isinstance(raw.get("model"), dict):
        sections.append((raw["model"].get("lora"), LORA_CONFIG))
    for values, config_class in sections:
        if isinstance(values, dict) and config_class is not None:
            _as_written(values, config_fields(config_class))


def _read_model_sections(values: Any, model: Type[BaseModel]) -> None:
    """``_as_written`` for a schema section, and the sections (or lists of them) nested in it."""
    if not isinstance(values, dict):
        return
    _as_written(values, {key: field_type(field.annotation) for key, field in model.model_fields.items()})
    for key, field in model.model_fields.items():
        for item in values.get(key) if isinstance(values.get(key), list) else [values.get(key)]:
            nested = model_in(field.annotation, item if isinstance(item, dict) else ())
            if isinstance(item, dict) and nested is not None:
                _read_model_sections(item, nested)


def _as_written(values: Dict[str, Any], fields: Mapping[str, FieldType]) -> None:
    for key, value in values.items():
        field = fields.get(key)
        kinds = field.kinds if field is not None else ()
        if isinstance(value, str) and "float" in kinds and "str" not in kinds and EXPONENT_NUMBER.match(value):
            values[key] = float(value)
        elif isinstance(value, bool) and field is not None and field.choices and "bool" not in kinds:
            words = [choice for choice in field.choices if choice in BOOLEAN_WORDS[value]]
            if len(words) == 1:
                values[key] = words[0]


def spec_from_json(text: str) -> Spec:
    """Parses a spec serialised by :meth:`Spec.to_json`, validating it again."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError([f"--spec-json: not valid JSON: {e}"]) from None
    if not isinstance(raw, dict):
        raise SpecError(["--spec-json: expected a JSON object"])
    return validate(raw)


def validate(raw: Mapping[str, Any], *, algorithm: Optional[str] = None, world_size: Optional[int] = None) -> Spec:
    """Validates a spec as plain data; raises SpecError listing every problem."""
    cls = _spec_class(raw, algorithm)
    raw = with_taskset_rows(raw, "train")
    problems = list(_unknown_keys(raw, cls))
    if problems:
        raise SpecError(problems)
    try:
        spec: Optional[Spec] = cls.model_validate(raw)
    except ValidationError as e:
        spec, problems = None, translate(e)
    training, model = raw.get("training"), raw.get("model")
    if isinstance(training, dict):
        fields = config_fields(cls.config_class)
        problems += _check_table(training, fields, "training")
        problems += range_problems(cls.config_class, fields, training)
        problems += finite_problems(training)
        problems += length_problems(cls.config_class, fields, training)
        problems += pattern_problems(cls.config_class, fields, training)
        problems += key_problems(cls.config_class, fields, training)
        problems += [] if problems else combination_problems(cls.config_class, fields, training)
    if isinstance(model, dict) and isinstance(model.get("lora"), dict):
        problems += _check_table(model["lora"], config_fields(LORA_CONFIG), "model.lora")
    if spec is not None and not problems:
        problems += spec.problems(world_size)
    # values that would do nothing: last, once the spec is sound
    if spec is not None and not problems:
        problems += unused_problems(cls.config_class, config_fields(cls.config_class), spec.training)
    if problems:
        raise SpecError(problems)
    assert spec is not None
    return spec


def _spec_class(raw: Mapping[str, Any], algorithm: Optional[str]) -> Type[Spec]:
    known = ", ".join(SPEC_CLASSES)
    name = raw.get("algorithm")
    if name is None:
        raise SpecError([f"algorithm: required; one of {known}"])
    if name not in SPEC_CLASSES:
        raise SpecError([f"algorithm: unknown {cut(repr(name))}; expected one of {known}"])
    if algorithm is not None and name != algorithm:
        raise SpecError(
            [
                f"algorithm: this spec is for {name!r} but was given to posttrain.{algorithm}; "
                f"run it with posttrain.{name}, or use a {algorithm} spec (templates/{algorithm}/)"
            ]
        )
    return SPEC_CLASSES[name]


def _unknown_keys(raw: Mapping[str, Any], cls: Type[Spec]) -> Iterator[str]:
    """Unknown keys everywhere, each with the nearest valid key; package-owned keys with their place."""
    owned = cls.owned_keys
    training_fields = config_fields(cls.config_class)
    paths = list(known_paths(cls))
    paths += [f"training.{k}" for k in training_fields if k not in owned and k not in cls.refused_keys]
    paths += [f"model.lora.{k}" for k in config_fields(LORA_CONFIG)]
    # what plays episodes, given to an algorithm that plays none: its place in evaluate: is not what was meant
    played = [] if issubclass(cls, AgentSection) else [key for key in AgentSection.model_fields if key in raw]
    for key in played:
        yield (
            f"{key}: posttrain.{cls.name()} plays no episodes; tools, environments and agent programs train with "
            "posttrain.grpo (an evaluate: section judges with them too)"
        )
    yield from unknown_in({k: v for k, v in raw.items() if k not in played}, cls, "", paths)
    training = raw.get("training")
    if isinstance(training, dict):
        refused = cls.refused_keys
        for key in training:
            if key in owned:
                yield f"training.{key}: set by posttrain, not in training; {owned[key]}"
            elif key in refused:
                yield f"training.{key}: not supported by posttrain.{cls.name()}; {refused[key]}"
        allowed = set(training_fields) - set(owned) - set(refused)
        named = set(owned) | set(refused)
        yield from unknown_mapping_keys(
            {k: v for k, v in training.items() if k not in named}, allowed, "training", paths
        )
    model = raw.get("model")
    if isinstance(model, dict) and isinstance(model.get("lora"), dict):
        yield from unknown_mapping_keys(model["lora"], set(config_fields(LORA_CONFIG)), "model.lora", paths)


def _check_table(values: Mapping[str, Any], table: Mapping[str, FieldType], prefix: str) -> List[str]:
    found = []
    for key, value in values.items():
        problem = table[key].check(value)
        if problem:
            found.append(f"{prefix}.{key}: {problem}")
    return found


# Keys (and sections) that do not change what a checkpoint holds: a resume may differ in them. The evaluation
# that follows training is judged apart (its own record in <output_dir>/eval).
NOT_TRAINING_RELEVANT = ("resume", "overwrite_output_dir", "training.output_dir", "evaluate")


def training_relevant(key: str) -> bool:
    """Whether a dotted key of :func:`spec_diff` changes what a checkpoint holds: not a timeout of the job's own
    (``distributed.timeout_s``, a function's ``timeout_s``), which bounds how long it waits; a built-in reward's
    arguments (``args.timeout_s``) change its scores."""
    if key.rpartition(".")[2].endswith("timeout_s") and ".args." not in key:
        return False
    return not any(key == name or key.startswith(f"{name}.") for name in NOT_TRAINING_RELEVANT)


# what a key a spec dump lacks amounts to
EMPTY = (None, [], {})


def spec_diff(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> List[Tuple[str, Any, Any]]:
    """The dotted keys whose values differ between two spec dumps. A key one of them lacks and the other holds empty
    (null, [], {}) is no difference: a section a later posttrain added, left unset.

    >>> spec_diff({"training": {"seed": 1, "max_steps": 5}}, {"training": {"seed": 2, "max_steps": 5}})
    [('training.seed', 1, 2)]
    >>> spec_diff({"algorithm": "grpo"}, {"algorithm": "grpo", "tools": [], "environment": None})
    []
    >>> spec_diff({"rewards": [{"builtin": "contains"}]}, {"rewards": [{"builtin": "contains", "timeout_s": 9.0}]})
    [('rewards.0.timeout_s', None, 9.0)]
    """
    found = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += spec_diff(a, b, f"{prefix}{key}.")
        elif _dicts_alike(a, b):
            for index, (item_a, item_b) in enumerate(zip(a, b)):
                found += spec_diff(item_a, item_b, f"{prefix}{key}.{index}.")
        elif a != b and not ((key not in old and b in EMPTY) or (key not in new and a in EMPTY)):
            found.append((f"{prefix}{key}", a, b))
    return found


def _dicts_alike(a: Any, b: Any) -> bool:
    """Two lists of as many mappings (``rewards``, ``tools``): compared item by item, key by key."""
    return (
        isinstance(a, list)
        and isinstance(b, list)
        and len(a) == len(b)
        and all(isinstance(item, dict) for item in [*a, *b])
    )
