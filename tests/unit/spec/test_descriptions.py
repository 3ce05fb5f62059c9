"""One text per algorithm (``components/spec/descriptions.py``) is its component's ``--help``, its reference page's
"What it does" and its entrypoint's pointer; it names what the spec class holds, and PPO's trainer logs what it
says."""

import ast
import fnmatch
import re
from pathlib import Path

import pytest
from torchx.specs.file_linter import get_fn_docstring

from helpers import REPO
from posttrain.components import algorithms, arguments
from posttrain.components.generate import reference
from posttrain.components.spec.descriptions import DESCRIPTIONS, PPO_METRICS, facts
from posttrain.components.spec.registry import SPEC_CLASSES, Spec
from ppo_setup import length, make_trainer


def test_every_algorithm_has_one_description() -> None:
    assert sorted(DESCRIPTIONS) == sorted(SPEC_CLASSES)


@pytest.mark.parametrize("algorithm", sorted(SPEC_CLASSES))
def test_the_component_help_is_the_description(algorithm: str) -> None:
    text = DESCRIPTIONS[algorithm]
    # what torchx run ... --help prints
    shown, described = get_fn_docstring(getattr(algorithms, algorithm))
    flat = " ".join(shown.split())
    for part in [text.summary, text.use, *(f"{label}: {line}" for label, line in facts(algorithm))]:
        assert " ".join(part.split()) in flat, part
    for command in text.examples:
        assert f"$ {command}" in shown
    # the Args: block stays torchx's argument help
    assert "spec" in described and "Args:" not in shown


@pytest.mark.parametrize("algorithm", sorted(SPEC_CLASSES))
def test_the_reference_page_and_the_entrypoint_show_the_description(algorithm: str) -> None:
    page = reference.render(algorithm)
    assert "## What it does" in page and f"- `{DESCRIPTIONS[algorithm].examples[0]}`" in page
    for label, _ in facts(algorithm):
        assert f"- **{label}**: " in page
    docstring = ast.get_docstring(ast.parse((REPO / "entrypoints" / f"{algorithm}.py").read_text()))
    assert docstring is not None and f"torchx run posttrain.{algorithm} --help" in docstring


def test_a_component_with_a_docstring_and_a_description_is_refused() -> None:
    def sft() -> None:
        """A second text."""

    with pytest.raises(TypeError, match="DESCRIPTIONS"):
        arguments.component(sft)


@pytest.mark.parametrize("algorithm", sorted(SPEC_CLASSES))
def test_the_description_names_the_spec_classes_columns_templates_and_refusals(algorithm: str) -> None:
    text, cls = DESCRIPTIONS[algorithm], SPEC_CLASSES[algorithm]
    for columns in cls.data_formats:
        assert all(f"``{column}``" in text.data for column in columns), columns
    for command in text.examples:
        spec = re.search(r"--spec (\S+)", command)
        assert spec is not None and (REPO / spec.group(1)).is_file(), command
    # its refusals are computed from the field table: the text points to them
    if algorithm == "ppo":
        assert "``PPOSpec.refused_keys``" in text.refuses
        return
    inherited = set()
    for base in cls.__mro__[1:]:
        if isinstance(base, type) and issubclass(base, Spec):
            inherited |= set(base.owned_keys) | set(base.refused_keys)
    # eval_*
    patterns = re.findall(r"``([^`]*\*[^`]*)``", text.refuses)
    by_reason = {}
    for key, why in {**cls.owned_keys, **cls.refused_keys}.items():
        if key not in inherited:
            by_reason.setdefault(why, []).append(key)
    # each reason of its own, with one of its keys at least
    for why, keys in by_reason.items():
        named = [key for key in keys if f"``{key}``" in text.refuses or any(fnmatch.fnmatch(key, p) for p in patterns)]
        assert named, (why, keys)


def test_ppo_logs_the_metrics_its_description_lists(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, [length])
    trainer.train()
    logged = trainer.state.log_history[0]
    assert sorted(set(logged) - {"epoch", "step"}) == sorted(PPO_METRICS)
    assert DESCRIPTIONS["ppo"].logs == PPO_METRICS
