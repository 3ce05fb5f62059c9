"""The spec's JSON Schemas (editors): they agree with the validator and the templates. (The template listing:
``tests/integration/test_schema_json.py``.)"""

import copy
import json
import re
from pathlib import Path
from typing import Any, Callable, Dict, Iterator

import jsonschema
import pytest
import yaml

from helpers import TEMPLATES, load_template
from posttrain.components.generate import schema_json
from posttrain.components.generate.schema_json import SCHEMA_DIR, SCHEMA_NAMES, render, schema_path, spec_schema
from posttrain.components.spec.fields import config_default
from posttrain.components.spec.loading import load_spec, validate
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.registry import SPEC_CLASSES

ALL_TEMPLATES = sorted(str(p.relative_to(TEMPLATES)) for p in TEMPLATES.glob("*/*.yaml"))
MODELINE = "# yaml-language-server: $schema=../../components/generated/schemas/{algorithm}.schema.json"


def validator(algorithm: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(schema_path(algorithm).read_text()))


@pytest.mark.parametrize("algorithm", sorted(SPEC_CLASSES))
def test_the_shipped_schemas_match_the_code(algorithm: str) -> None:
    """Fails when the spec classes or config_fields.json change.

    Regenerate with ``python -m posttrain.components.generate.schema_json --all``.
    """
    assert schema_path(algorithm).read_text() == render(algorithm)
    jsonschema.Draft202012Validator.check_schema(json.loads(render(algorithm)))


def test_no_stale_schema_files() -> None:
    assert sorted(p.name for p in SCHEMA_DIR.iterdir()) == sorted(f"{a}.schema.json" for a in SCHEMA_NAMES)


@pytest.mark.parametrize("name", ["eval", "chain"])
def test_the_eval_and_chain_schemas_match_the_code(name: str) -> None:
    assert schema_path(name).read_text() == render(name)
    jsonschema.Draft202012Validator.check_schema(json.loads(render(name)))


def test_training_and_lora_come_from_the_field_table() -> None:
    schema = spec_schema("sft")
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["algorithm"]["const"] == "sft"
    assert schema["additionalProperties"] is False
    training = schema["properties"]["training"]
    assert training["additionalProperties"] is False and training["required"] == ["output_dir"]
    props = training["properties"]
    default = config_default("trl:SFTConfig", "learning_rate")
    # the number, and the text PyYAML reads 3e-3 as
    number, text = props["learning_rate"]["anyOf"]
    assert number == {"type": "number", "exclusiveMinimum": 0} and props["learning_rate"]["default"] == default
    assert text["type"] == "string" and re.fullmatch(text["pattern"], "3e-3")
    assert props["adam_beta2"]["anyOf"][0]["minimum"] == 0 and props["adam_beta2"]["anyOf"][0]["exclusiveMaximum"] == 1
    assert props["max_length"]["type"] == ["integer", "null"] and props["max_length"]["minimum"] == 1
    grpo = spec_schema("grpo")["properties"]["training"]["properties"]
    assert (grpo["top_p"]["anyOf"][0]["exclusiveMinimum"], grpo["top_p"]["anyOf"][0]["maximum"]) == (0, 1)
    assert "cosine" in props["lr_scheduler_type"]["enum"]
    # package-owned: errors
    assert not set(SPEC_CLASSES["sft"].owned_keys) & set(props)
    assert "deepspeed" in training["description"]
    lora = schema["$defs"]["ModelSpec"]["properties"]["lora"]["anyOf"][0]
    assert lora["additionalProperties"] is False and lora["properties"]["r"]["type"] == "integer"
    assert all(d["additionalProperties"] is False for d in schema["$defs"].values())
    assert "reward_weights" not in spec_schema("grpo")["properties"]["training"]["properties"]
    assert "teacher_model" in spec_schema("distill")["required"]


def test_the_command_line_prints_and_writes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert schema_json.main(["dpo"]) == 0
    assert capsys.readouterr().out == render("dpo")
    assert schema_json.main(["--all", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in SCHEMA_DIR.iterdir())
    assert (tmp_path / "ppo.schema.json").read_text() == render("ppo")


# one spec each: the algorithms', the eval's and the chain's
@pytest.mark.parametrize("template", ALL_TEMPLATES)
def test_every_template_points_at_its_schema_and_validates(template: str) -> None:
    raw = load_template(template)
    algorithm = raw["algorithm"]
    first_line = (TEMPLATES / template).read_text().splitlines()[0]
    assert first_line == MODELINE.format(algorithm=algorithm)
    target = (TEMPLATES / template).parent / first_line.split("$schema=", 1)[1]
    assert target.resolve() == schema_path(algorithm).resolve()
    validator(algorithm).validate(raw)


def test_what_pyyaml_reads_passes_the_schema_as_it_passes_the_validator(tmp_path: Path) -> None:
    """YAML 1.1 (PyYAML) reads 3e-3 as text and no as false; posttrain takes them as written, and so does the schema:
    a user's CI that loads a spec with PyYAML and checks it with jsonschema passes what torchx run passes."""
    text = (TEMPLATES / "grpo/tiny.yaml").read_text()
    text = re.sub(r"learning_rate: \S+", "learning_rate: 3e-3", text).replace(
        "args: {target: blue}", "args: {target: blue}\n    weight: 5e-1"
    )
    (tmp_path / "spec.yaml").write_text(text + "  adam_epsilon: 1e-8\n  eval_strategy: no\n")
    raw = yaml.safe_load((tmp_path / "spec.yaml").read_text())
    assert (raw["training"]["learning_rate"], raw["rewards"][0]["weight"], raw["training"]["eval_strategy"]) == (
        "3e-3",
        "5e-1",
        False,
    )
    validator("grpo").validate(raw)
    spec = load_spec(str(tmp_path / "spec.yaml"))
    assert (spec.training["learning_rate"], spec.rewards[0].weight, spec.training["eval_strategy"]) == (3e-3, 0.5, "no")
    raw["training"]["learning_rate"] = "3e-3 please"
    assert list(validator("grpo").iter_errors(raw))


@pytest.mark.parametrize("algorithm", SCHEMA_NAMES)
def test_every_field_of_every_schema_says_what_it_is(algorithm: str) -> None:
    """An editor's hover text: TRL's, transformers' and PEFT's help for their fields, posttrain's for its own."""

    def undescribed(node: Any, where: str) -> Iterator[str]:
        if isinstance(node, dict):
            for name, prop in (node.get("properties") or {}).items():
                if not isinstance(prop, dict) or not prop.get("description", "").strip():
                    yield f"{where}.{name}"
            for key, value in node.items():
                yield from undescribed(value, f"{where}/{key}")
        elif isinstance(node, list):
            for value in node:
                yield from undescribed(value, where)

    schema = json.loads(schema_path(algorithm).read_text())
    assert not list(undescribed(schema, algorithm))
    if algorithm not in SPEC_CLASSES:
        return
    training = schema["properties"]["training"]["properties"]
    assert training["learning_rate"]["description"].startswith("The initial learning rate")
    assert "A probability mass" in training.get("top_p", {"description": "A probability mass"})["description"]


def _set(path: str, value: Any) -> Callable[[Dict[str, Any]], None]:
    def mutate(raw: Dict[str, Any]) -> None:
        *parents, key = path.split(".")
        node = raw
        for parent in parents:
            node = node.setdefault(parent, {})
        node[key] = value

    return mutate


def _drop_output_dir(raw: Dict[str, Any]) -> None:
    del raw["training"]["output_dir"]


MUTATIONS = {
    "unknown training key": _set("training.learnig_rate", 1e-5),
    "package-owned training key": _set("training.deepspeed", "ds.json"),
    "wrong type": _set("training.learning_rate", "fast"),
    "bool for an int": _set("training.max_steps", True),
    "wrong enum value": _set("training.lr_scheduler_type", "cosin"),
    "wrong section enum": _set("model.dtype", "fp8"),
    "not positive": _set("training.learning_rate", 0),
    "unknown lora key": _set("model.lora", {"r": 8, "rank": 8}),
    "unknown section key": _set("distributed.deepspeed", {"stage": 2}),
    "unknown top-level key": _set("lora", {"r": 8}),
    "missing output_dir": _drop_output_dir,
}


@pytest.mark.parametrize("template", ["sft/tiny.yaml", "grpo/tiny.yaml", "ppo/tiny.yaml"])
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_mutated_templates_fail_the_schema_and_the_validator(template: str, mutation: str) -> None:
    raw = copy.deepcopy(load_template(template))
    MUTATIONS[mutation](raw)
    assert list(validator(raw["algorithm"]).iter_errors(raw)), mutation
    # the schema says no more than the validator does
    with pytest.raises(SpecError):
        validate(raw)
