"""The template listing and the light client: ``python -m posttrain.components.tools.templates`` lists every
template with its command, the listing's and the schemas' doctests pass, and the two modules import no torch, TRL
or transformers in a process of their own."""

import doctest
import subprocess
import sys

from helpers import REPO, TEMPLATES
from posttrain.components.generate import schema_json
from posttrain.components.tools import templates

ALL_TEMPLATES = sorted(str(p.relative_to(TEMPLATES)) for p in TEMPLATES.glob("*/*.yaml"))


def test_every_template_is_listed_with_its_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "posttrain.components.tools.templates"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert sorted(rows) == [f"templates/{t}" for t in ALL_TEMPLATES]
    for template in ALL_TEMPLATES:
        command = next(
            line[2:] for line in (TEMPLATES / template).read_text().splitlines() if line.startswith("# torchx run")
        )
        assert f"  {command}  " in rows[f"templates/{template}"], template
    listed = {t.path: t for t in templates.templates()}
    assert listed["templates/sft/tiny.yaml"].description.startswith("SFT of the built-in tiny Llama")
    assert all(t.description and t.commands for t in listed.values())


def test_doctests_and_a_light_client() -> None:
    for module in (schema_json, templates):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
    code = (
        "import sys, posttrain.components.generate.schema_json, posttrain.components.tools.templates; "
        "print(sorted(m for m in ('torch', 'trl', 'transformers', 'deepspeed', 'peft') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stdout.strip() == "[]"
