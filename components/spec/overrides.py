"""``key.path=value`` overrides: applied on top of a spec's YAML before validation.

Each value is converted by the type of the field it lands on (``1e-5`` is a
float for ``training.learning_rate``; a string field keeps the raw text);
missing sections are created. ``~key.path`` removes a key (Hydra's syntax):
the field then takes its default, as if the spec never set it.
"""

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Type

import yaml
from pydantic import BaseModel

from posttrain.components.spec.fields import LORA_CONFIG, FieldType, config_fields, field_type
from posttrain.components.spec.messages import SpecError, cut, model_in
from posttrain.components.spec.registry import SPEC_CLASSES
from posttrain.components.spec.schema import Spec


def apply_overrides(
    raw: Mapping[str, Any], overrides: Sequence[str], algorithm: Optional[str] = None
) -> Dict[str, Any]:
    """Returns a copy of ``raw`` with ``key.path=value`` overrides applied; ``raw`` is not modified.

    >>> apply_overrides({"algorithm": "sft", "training": {}}, ["training.learning_rate=1e-5"])["training"]
    {'learning_rate': 1e-05}
    """
    result = json.loads(json.dumps(raw))
    name = result.get("algorithm", algorithm)
    cls = SPEC_CLASSES.get(name) if isinstance(name, str) else None
    for override in overrides:
        if override.startswith("-"):
            raise SpecError(
                [
                    f"override {cut(repr(override))}: options such as {override.split('=')[0]} go before the key.path=value overrides"
                ]
            )
        if override.startswith("~"):
            _remove_path(result, override[1:].strip(), override)
            continue
        key, sep, text = override.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpecError(
                [f"override {cut(repr(override))}: expected key.path=value (e.g. training.learning_rate=1e-5)"]
            )
        parts = key.split(".")
        if any(not part for part in parts):
            raise SpecError([f"override {cut(repr(override))}: empty key segment in {key!r}"])
        target = _type_at(cls, parts) if cls else None
        _check_flow_syntax(text, target, override)
        value = target.convert(text) if target else FieldType(("any",)).convert(text)
        _set_path(result, parts, value, override)
    return result


def _check_flow_syntax(text: str, target: Optional[FieldType], override: str) -> None:
    """``[a, b`` meant a list: refuse it rather than keep it as a string (unless the field takes only text)."""
    if not text.lstrip().startswith(("[", "{")) or (target is not None and target.kinds == ("str",)):
        return
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as error:
        problem = getattr(error, "problem", None) or "not valid"
        raise SpecError(
            [
                f"override {cut(repr(override))}: {text} is not YAML flow syntax ({problem}); a list is [a, b], a mapping {{k: v}}"
            ]
        ) from None


def _set_path(root: Dict[str, Any], parts: List[str], value: Any, override: str) -> None:
    node: Any = root
    for depth, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            node = node[_list_index(node, part, parts[: depth + 1], override)]
            continue
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
        if not isinstance(node, (dict, list)):
            where = ".".join(parts[: depth + 1])
            raise SpecError([f"override {cut(repr(override))}: {where} is a value, not a section"])
    if isinstance(node, list):
        node[_list_index(node, parts[-1], parts, override)] = value
    else:
        node[parts[-1]] = value


def _remove_path(root: Dict[str, Any], key: str, override: str) -> None:
    if not key or "=" in key:
        raise SpecError(
            [f"override {cut(repr(override))}: expected ~key.path, which removes a key (e.g. ~training.vllm_mode)"]
        )
    parts = key.split(".")
    if any(not part for part in parts):
        raise SpecError([f"override {cut(repr(override))}: empty key segment in {key!r}"])
    node: Any = root
    for depth, part in enumerate(parts[:-1]):
        # an item of a list of sections: rewards.0.weight
        if isinstance(node, list):
            node = node[_list_index(node, part, parts[: depth + 1], override)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise SpecError(
                [f"override {cut(repr(override))}: the spec has no {'.'.join(parts[: depth + 1])} to remove"]
            )
    if isinstance(node, list):
        raise SpecError(
            [
                f"override {cut(repr(override))}: {'.'.join(parts[:-1])} is a list; ~ removes keys of sections, "
                "not items (override the list instead)"
            ]
        )
    if not isinstance(node, dict) or parts[-1] not in node:
        raise SpecError([f"override {cut(repr(override))}: the spec has no {key} to remove"])
    del node[parts[-1]]


def _list_index(node: List[Any], part: str, parts: List[str], override: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        where = ".".join(parts)
        raise SpecError([f"override {cut(repr(override))}: {where}: expected a list index below {len(node)}"])
    return int(part)


def _type_at(cls: Type[Spec], parts: Sequence[str]) -> Optional[FieldType]:
    """The FieldType of the field at ``parts``, or None where unknown."""
    if parts[0] == "training" and len(parts) == 2:
        return config_fields(cls.config_class).get(parts[1])
    if parts[:2] == ["model", "lora"] and len(parts) == 3:
        return config_fields(LORA_CONFIG).get(parts[2])
    model: Optional[Type[BaseModel]] = cls
    annotation: Any = None
    for part in parts:
        if part.isdigit():
            # an item of a list of sections: same model
            continue
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return None
        annotation = field.annotation
        model = model_in(annotation)
    return field_type(annotation)
