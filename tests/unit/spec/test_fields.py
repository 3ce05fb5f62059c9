"""The field table that lets the client validate TRL/PEFT configs without importing them."""

import doctest
import importlib

import pytest

from posttrain.components.generate.field_table import generate_table, render_table
from posttrain.components.spec import fields
from posttrain.components.spec.fields import TABLE_PATH, FieldType, config_fields


def test_the_shipped_table_matches_the_installed_trl_and_peft() -> None:
    """Fails when trl/peft/transformers drift: run `python -m posttrain.components.generate.field_table`."""
    assert TABLE_PATH.read_text() == render_table(generate_table())


def test_known_fields_have_the_expected_types() -> None:
    sft = config_fields("trl:SFTConfig")
    assert sft["learning_rate"] == FieldType(("float",))
    assert sft["max_steps"] == FieldType(("int",))
    assert sft["max_length"] == FieldType(("int",), nullable=True)
    assert "cosine" in sft["lr_scheduler_type"].choices
    assert config_fields(fields.LORA_CONFIG)["target_modules"].kinds == ("list", "str")


@pytest.mark.parametrize(
    "field_type, text, expected",
    [
        (FieldType(("int",)), "3", 3),
        (FieldType(("float",)), "3", 3.0),
        (FieldType(("bool",), nullable=True), "null", None),
        (FieldType(("bool",)), "True", True),
        (FieldType(("str",)), "  spaced  ", "  spaced  "),
        (FieldType(("dict", "str")), "{a: 1}", {"a": 1}),
        (FieldType(("dict", "str")), "plain", "plain"),
        (FieldType(("bool", "str")), "all", "all"),
        # kept; validation reports it
        (FieldType(("int",)), "many", "many"),
    ],
)
def test_override_conversion(field_type: FieldType, text: str, expected: object) -> None:
    converted = field_type.convert(text)
    assert converted == expected and type(converted) is type(expected)


def test_client_modules_doctests() -> None:
    for name in ("spec.fields", "spec.loading", "appdef", "spec.messages", "spec.overrides", "generate.field_table"):
        module = importlib.import_module(f"posttrain.components.{name}")
        result = doctest.testmod(module)
        assert result.failed == 0, name
    assert doctest.testmod(fields).attempted > 0
