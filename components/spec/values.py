"""Ranges and choices of ``training`` values: the table of the installed TRL version.

Types come from TRL's annotations (``config_fields.json``); what the types
cannot say is in ``value_rules/trl-<major>.<minor>.yaml``, one row per rule
with its reason: ranges written where TRL has none, the value lists TRL
documents, the kinds TRL accepts beyond its annotation (it converts them
itself), the form of a text value, the keys a mapping value may hold, the
combinations TRL's trainers refuse, and the values that do nothing with others.
Choices in TRL's own field metadata are read from TRL when the field table is
generated. Messages name the key, the value and what is
allowed::

    training.top_p: 1.5 is out of range; expected 0 < top_p <= 1 (a probability mass; 1 keeps every token)
"""

import dataclasses
import functools
import math
import re
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import yaml

from posttrain.components.spec.fields import config_fields, config_value
from posttrain.components.spec.messages import cut, unknown_message

RULES_DIR = Path(__file__).with_name("value_rules")

_RANGE = re.compile(r"^(?:(?P<low>-?[\d.]+)\s*(?P<low_op><=|<)\s*)?x(?:\s*(?P<op><=|<|>=|>)\s*(?P<bound>-?[\d.]+))?$")


@dataclasses.dataclass(frozen=True)
class Range:
    """``low <(=) x <(=) high``, either end open; parsed from the table's ``"0 < x <= 1"``.

    >>> Range.parse("0 < x <= 1").problem("top_p", 1.5)
    '1.5 is out of range; expected 0 < top_p <= 1'
    >>> Range.parse("x >= 2").problem("num_generations", 2) is None
    True
    """

    text: str
    low: Optional[float] = None
    low_inclusive: bool = True
    high: Optional[float] = None
    high_inclusive: bool = True

    @staticmethod
    def parse(text: str) -> "Range":
        match = _RANGE.match(text.strip())
        if not match:
            raise ValueError(f"range {text!r}: expected e.g. '0 < x <= 1' or 'x >= 0'")
        low, low_op, op, bound = match.group("low", "low_op", "op", "bound")
        found: Dict[str, Any] = {}
        if low is not None:
            found.update(low=float(low), low_inclusive=low_op == "<=")
        if op in ("<", "<="):
            found.update(high=float(bound), high_inclusive=op == "<=")
        elif op in (">", ">="):
            found.update(low=float(bound), low_inclusive=op == ">=")
        return Range(text.strip(), **found)

    def problem(self, key: str, value: Any) -> Optional[str]:
        """What is wrong with a number for this range, or None (non-numbers are the type check's)."""
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        too_low = self.low is not None and (value < self.low if self.low_inclusive else value <= self.low)
        too_high = self.high is not None and (value > self.high if self.high_inclusive else value >= self.high)
        if too_low or too_high:
            return f"{value} is out of range; expected {self.text.replace('x', key)}"
        return None


@functools.lru_cache(maxsize=None)
def rules() -> Tuple[Dict[str, Any], ...]:
    """The rows for the installed TRL (its major.minor), else the newest table the package ships."""
    tables = {path.stem: path for path in RULES_DIR.glob("trl-*.yaml")}
    try:
        wanted = "trl-" + ".".join(metadata.version("trl").split(".")[:2])
    except metadata.PackageNotFoundError:
        # a client without trl validates with the newest table
        wanted = ""
    path = tables.get(wanted) or tables[max(tables, key=lambda name: tuple(int(p) for p in name[4:].split(".")))]
    # libyaml's loader where PyYAML has it: 1 ms against 10 ms for this table, on the client and in every process
    table = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506
    return tuple(row for entry in table for row in _per_field(entry))


def _per_field(entry: Dict[str, Any]) -> List[Dict[str, Any]]:
    """A table entry as rows of one ``field`` each: an entry naming ``fields`` (several fields under one rule, such
    as a field and its old name) gives one row per field."""
    if "fields" not in entry:
        return [entry]
    rule = {key: value for key, value in entry.items() if key != "fields"}
    return [{**rule, "field": field} for field in entry["fields"]]


def rows_for(config_class: str, fields: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The rows that apply to a config class: those naming it, or naming none, for a field it has."""
    return [row for row in rules() if row["field"] in fields and config_class in row.get("configs", [config_class])]


def range_problems(config_class: str, fields: Mapping[str, Any], training: Mapping[str, Any]) -> List[str]:
    """``training`` values outside their ranges (each item of a list value checked alone)."""
    found = []
    for row in rows_for(config_class, fields):
        key = row["field"]
        if "range" not in row or key not in training:
            continue
        values = training[key] if isinstance(training[key], list) else [training[key]]
        for value in values:
            problem = Range.parse(row["range"]).problem(key, value)
            if problem:
                found.append(f"training.{key}: {problem} ({row['reason']})")
                break
    return found


def finite_problems(training: Mapping[str, Any]) -> List[str]:
    """Numbers that are not finite (YAML's .nan and .inf), anywhere in a value: no trainer option means them."""

    def infinite(value: Any) -> bool:
        if isinstance(value, float):
            return not math.isfinite(value)
        items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        return any(infinite(item) for item in items)

    found = []
    for key, value in training.items():
        if infinite(value):
            what = "holds a number that is not finite" if isinstance(value, (dict, list)) else "is not a finite number"
            found.append(f"training.{key}: {_shown(value)} {what}; expected finite numbers")
    return found


def length_problems(config_class: str, fields: Mapping[str, Any], training: Mapping[str, Any]) -> List[str]:
    """List values whose ``length_of`` row names the field they pair with, item by item (one item for a single
    value; unset: TRL's default)."""
    found = []
    for row in rows_for(config_class, fields):
        key, paired = row["field"], row.get("length_of")
        if paired is None or not isinstance(training.get(key), list):
            continue
        other = config_value(config_class, training, paired)
        count = len(other) if isinstance(other, list) else 1
        if len(training[key]) != count:
            given = f"training.{key}: {len(training[key])} values for {count} in {paired} ({_shown(other)})"
            found.append(f"{given}; give one per item ({row['reason']})")
    return found


def pattern_problems(config_class: str, fields: Mapping[str, Any], training: Mapping[str, Any]) -> List[str]:
    """Text ``training`` values that do not match their row's ``pattern`` (non-text values are the type check's)."""
    found = []
    for row in rows_for(config_class, fields):
        key = row["field"]
        value = training.get(key)
        if "pattern" in row and isinstance(value, str) and not re.fullmatch(row["pattern"], value):
            found.append(f"training.{key}: {value} is not {row['expected']} ({row['reason']})")
    return found


def combination_problems(config_class: str, fields: Mapping[str, Any], training: Mapping[str, Any]) -> List[str]:
    """``training`` values that the ``requires`` rows refuse, with the values of their ``when`` (unset: TRL's
    defaults), or alone in the configs they name."""
    found = []
    for row, when in _holding(config_class, fields, training, "requires"):
        key, required = row["field"], row["requires"]
        value = config_value(config_class, training, key)
        # a range: null is out of it
        if isinstance(required, str):
            wrong = value is None or Range.parse(required).problem(key, value) is not None
            expected = required.replace("x", key)
        else:
            wrong, expected = not _holds(value, required), " or ".join(_shown(choice) for choice in required)
        if wrong:
            given = "" if key in training else " (TRL's default)"
            condition = f"cannot go with {_condition(when, training)}" if when else "is not taken here"
            found.append(f"training.{key}: {_shown(value)}{given} {condition}; expected {expected} ({row['reason']})")
    return found


def key_problems(config_class: str, fields: Mapping[str, Any], training: Mapping[str, Any]) -> List[str]:
    """Keys of mapping values that the ``keys`` rows holding for ``training`` do not allow (a field's rows add up;
    the first says why), and the keys a row ``needs`` (exactly one of them). A JSON string is left to TRL."""
    holding: Dict[str, List[Tuple[Dict[str, Any], Dict[str, Any]]]] = {}
    for row, when in _holding(config_class, fields, training, "keys"):
        holding.setdefault(row["field"], []).append((row, when))
    found = []
    for field, rows in holding.items():
        value = {} if training.get(field) is None else training[field]
        if not isinstance(value, dict):
            continue
        allowed, (first, first_when) = [key for row, _ in rows for key in row["keys"]], rows[0]
        prefix = f"training.{field}."
        for key in value:
            if key in allowed:
                continue
            if allowed:
                unknown = unknown_message(prefix + str(key), set(allowed), prefix, [])
            else:
                condition = _condition(first_when, training)
                unknown = f"{prefix}{key}: unknown key; none are taken with {condition}"
            found.append(f"{unknown} ({first['reason']})")
        for row, when in rows:
            needs = row.get("needs", [])
            given = [key for key in needs if key in value]
            if needs and len(given) != 1:
                what = needs[0] if len(needs) == 1 else "exactly one of " + ", ".join(needs)
                got = f"; got {', '.join(given)}" if given else ""
                condition = _condition(when, training)
                found.append(f"training.{field}: needs {what} with {condition}{got} ({row['reason']})")
    return found


def unused_problems(config_class: str, fields: Mapping[str, Any], training: Mapping[str, Any]) -> List[str]:
    """``training`` values given (not null) where they do nothing: the ``unused`` rows whose ``when`` holds (a row
    without ``when``: the config's trainer never reads the field)."""
    found = []
    for row, when in _holding(config_class, fields, training, "unused"):
        key = row["field"]
        if training.get(key) is not None:
            condition = f" with {_condition(when, training)}" if when else ""
            hint = f"{row['unused']}, or drop it" if row["unused"] else "drop it"
            found.append(f"training.{key}: {_shown(training[key])} does nothing{condition}; {hint} ({row['reason']})")
    return found


def least_per_device_batch(config_class: str, training: Mapping[str, Any]) -> int:
    """The fewest examples per device the ``requires`` rows allow (KTO's KL term: 2); the job never shrinks below."""
    least = 1
    for row, _ in _holding(config_class, config_fields(config_class), training, "requires"):
        if row["field"] == "per_device_train_batch_size" and isinstance(row["requires"], str):
            bound = Range.parse(row["requires"])
            if bound.low is not None:
                least = max(least, int(bound.low) + (0 if bound.low_inclusive else 1))
    return least


def _holding(
    config_class: str, fields: Mapping[str, Any], training: Mapping[str, Any], kind: str
) -> Iterator[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """The rows of a kind (``requires``, ``keys``, ``unused``) whose ``when`` holds for ``training`` and whose
    ``unless`` does not, each with those fields' values (unset: TRL's defaults); a row with neither always holds."""
    for row in rows_for(config_class, fields):
        if kind in row:
            wanted, unwanted = row.get("when", {}), row.get("unless", {})
            when = {key: config_value(config_class, training, key) for key in [*wanted, *unwanted]}
            if all(_holds(when[key], value) for key, value in wanted.items()) and not any(
                _holds(when[key], value) for key, value in unwanted.items()
            ):
                yield row, when


def _condition(when: Dict[str, Any], training: Mapping[str, Any]) -> str:
    """A row's ``when`` fields as they hold: ``loss_type: exo_pair, use_vllm: false (TRL's default)``."""
    shown = [f"{name}: {_shown(when[name])}" + ("" if name in training else " (TRL's default)") for name in when]
    return ", ".join(shown)


def _holds(value: Any, wanted: Any) -> bool:
    """Whether ``value`` (or, for a list, one of its items) is ``wanted`` (or one of them, for a list): equal and
    of one kind (``0`` is ``0.0``; ``true`` is not ``1``)."""
    values, choices = (item if isinstance(item, list) else [item] for item in (value, wanted))
    return any(v is c or (v == c and _kind(v) == _kind(c)) for v in values for c in choices)


def _kind(value: Any) -> Any:
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value)


def _shown(value: Any) -> str:
    """A value as YAML writes it: true, null, 0.0, exo_pair, [a, b]."""
    return cut(yaml.safe_dump(value, default_flow_style=True, width=float("inf")).removesuffix("\n...\n").strip())


def generation_batch_problems(training: Mapping[str, Any], config_class: str, world_size: int) -> List[str]:
    """TRL's generation-batch rules, checked at submit time with the world size from ``-j``: the generation batch
    and, where the trainer evaluates, the evaluation batch hold whole groups of ``num_generations`` completions.

    TRL raises these only once the job runs; here the message says which
    numbers to change.
    """

    def value(key: str) -> Any:
        return config_value(config_class, training, key)

    per_device, accumulation = value("per_device_train_batch_size"), value("gradient_accumulation_steps")
    generations = value("num_generations")
    generation_batch, steps = value("generation_batch_size"), value("steps_per_generation")
    if generation_batch is not None and steps is not None:
        return ["training.generation_batch_size, training.steps_per_generation: set at most one"]
    global_batch = per_device * world_size
    if generation_batch is None:
        generation_batch = global_batch * (steps if steps is not None else accumulation)
        how = f"{per_device} per device x {world_size} processes x {steps or accumulation} steps"
    elif generation_batch % global_batch:
        return [
            f"training.generation_batch_size: {generation_batch} is not a multiple of the global batch "
            f"({per_device} per device x {world_size} processes = {global_batch}); use a multiple of {global_batch}"
        ]
    else:
        how = "training.generation_batch_size"
    if generations and generation_batch % generations:
        divisors = [n for n in range(2, generation_batch + 1) if generation_batch % n == 0]
        return [
            f"training.num_generations: the generation batch ({generation_batch} = {how}) must divide by "
            f"num_generations ({generations}); set num_generations to one of {divisors}, or change "
            f"per_device_train_batch_size (or -j) so the batch is a multiple of {generations}"
        ]
    eval_generations = value("num_generations_eval") or generations
    eval_batch = value("per_device_eval_batch_size") * world_size
    if value("eval_strategy") != "no" and eval_generations and eval_batch % eval_generations:
        key = "num_generations_eval" if value("num_generations_eval") else "num_generations"
        return [
            f"training.per_device_eval_batch_size: the evaluation batch ({value('per_device_eval_batch_size')} per "
            f"device x {world_size} processes = {eval_batch}) must divide by {key} ({eval_generations}); use a "
            f"multiple of {eval_generations // math.gcd(eval_generations, world_size)}, or a num_generations_eval that "
            f"divides {eval_batch}"
        ]
    return []
