"""The template listing and the light client: ``posttrain templates ls`` lists every template by name with its
command, the listing's and the schemas' doctests pass, and the schemas' module and the ``posttrain`` command import no
torch, TRL or transformers in a process of their own."""

import doctest
import subprocess
import sys

from helpers import POSTTRAIN, REPO, TEMPLATES
from posttrain.components.generate import schema_json
from posttrain.components.tools import templates

ALL_TEMPLATES = sorted(p.relative_to(TEMPLATES).with_suffix("").as_posix() for p in TEMPLATES.glob("*/*.yaml"))


def test_every_template_is_listed_by_name_with_its_command_run_by_name() -> None:
    result = subprocess.run(
        [POSTTRAIN, "templates", "ls"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:] if not line.startswith(" ")}
    assert sorted(rows) == ALL_TEMPLATES
    for template in ALL_TEMPLATES:
        command = next(
            line[2:]
            for line in (TEMPLATES / f"{template}.yaml").read_text().splitlines()
            if line.startswith("# torchx run")
        )
        by_name = command.replace(f"--spec templates/{template}.yaml", f"--spec {template}")
        assert f"--spec {template}" in by_name and f"  {by_name}  " in rows[template], template
    listed = {t.name: t for t in templates.templates()}
    assert listed["sft/tiny"].description.startswith("SFT of the built-in tiny Llama")
    assert all(t.description and t.commands for t in listed.values())


def test_doctests_and_a_light_client() -> None:
    for module in (schema_json, templates):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
    code = (
        "import sys, posttrain.components.generate.schema_json, posttrain.components.tools.cli; "
        "print(sorted(m for m in ('torch', 'trl', 'transformers', 'deepspeed', 'peft') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stdout.strip() == "[]"
