"""The shipped templates by name (``--spec sft/tiny``), the shipped files their paths name, and copies of them
(``posttrain templates cp``): from any directory, a template by name and its copy are
the same run."""

from pathlib import Path
from typing import Any

import pytest

from helpers import REPO, TEMPLATES
from posttrain.components.spec.chain import load_chain
from posttrain.components.spec.evaluation import load_eval
from posttrain.components.spec.loading import load_spec
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.shipped import TEMPLATES_DIR, spec_file
from posttrain.components.tools import templates

NAMES = sorted(path.relative_to(TEMPLATES).with_suffix("").as_posix() for path in TEMPLATES.glob("*/*.yaml"))


def load(spec: str) -> Any:
    """A template's validated spec, as its component loads it."""
    text = Path(spec_file(spec)).read_text()
    algorithm = next(line.split(": ")[1] for line in text.splitlines() if line.startswith("algorithm: "))
    if algorithm == "chain":
        return load_chain(spec)
    if algorithm == "eval":
        return load_eval(spec)
    return load_spec(spec)


def test_a_name_is_a_shipped_template_where_no_such_path_is_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert TEMPLATES_DIR == TEMPLATES
    monkeypatch.chdir(tmp_path)
    assert spec_file("sft/tiny") == str(TEMPLATES / "sft/tiny.yaml")
    # a path keeps meaning a path: one here, one with its suffix, one that names nothing
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft/tiny").write_text("algorithm: sft\n")
    assert spec_file("sft/tiny") == "sft/tiny"
    assert spec_file("dpo/tiny.yaml") == "dpo/tiny.yaml"
    # a folder is no spec (a run's output_dir of that name), nor is anything but <algorithm>/<name>
    (tmp_path / "dpo/tiny").mkdir(parents=True)
    assert spec_file("dpo/tiny") == str(TEMPLATES / "dpo/tiny.yaml")
    for other in (str(TEMPLATES / "sft/tiny"), "eval/tasks/answer_form", "../templates/sft/tiny", "sft"):
        assert spec_file(other) == other
    with pytest.raises(SpecError) as error:
        load_spec("sft/tny")
    assert str(error.value) == (
        "--spec: no such file: sft/tny, nor a template's name (posttrain templates ls lists them)"
    )
    # a checkout's path to a template, where there is no checkout
    with pytest.raises(SpecError, match=r"^--spec: no such file: templates/sft/tiny.yaml; the shipped template of "):
        load_spec("templates/sft/tiny.yaml")


def test_a_shipped_template_names_the_installed_files_from_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # from the checkout's root: the paths as written
    monkeypatch.chdir(REPO)
    assert load_spec("sft/tiny").data.train.path == "templates/data/sft_chat.jsonl"
    assert load_spec("templates/sft/tiny.yaml").data.train.path == "templates/data/sft_chat.jsonl"
    # from elsewhere: the installed files, but where the run writes, and what an override names
    monkeypatch.chdir(tmp_path)
    spec = load_spec("sft/tiny")
    assert spec.data.train.path == str(TEMPLATES / "data/sft_chat.jsonl")
    assert spec.training["output_dir"] == "outputs/sft-tiny"
    overridden = load_spec("sft/tiny", ["data.train.path=templates/data/other.jsonl"])
    assert overridden.data.train.path == "templates/data/other.jsonl"
    chain = load_chain("chain/tool-use-tiny")
    # a stage read from its own file, and a stage's inline data
    stages = {stage.name: stage.spec for stage in chain.stages}
    assert stages["sft"].data.train.path == str(TEMPLATES / "data/tool_use_demos.jsonl")
    assert stages["lamp"].data.train.path == str(TEMPLATES / "data/lamp_requests.jsonl")
    assert load_chain("chain/rlhf-tiny").stages[0].spec.data.train.path == str(TEMPLATES / "data/sft_chat.jsonl")
    assert load_eval("eval/benchmarks-tiny").benchmarks.include_path == str(TEMPLATES / "eval/tasks")
    # from the folder that holds the checkout (a project with its .venv, say): full paths, never ones through it
    monkeypatch.chdir(REPO.parent)
    assert load_spec("sft/tiny").data.train.path == str(TEMPLATES / "data/sft_chat.jsonl")


@pytest.mark.parametrize("name", NAMES)
def test_a_copy_is_the_template_run_by_name(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    target, named = templates.copy(name, "copy.yaml")
    assert target == Path("copy.yaml")
    # data by their full paths, a chain's stages by their names
    assert all(
        Path(path).is_absolute() and Path(path).exists() or (TEMPLATES / f"{path}.yaml").is_file() for path in named
    )
    assert load("copy.yaml").to_json() == load(name).to_json()
    text = target.read_text()
    assert "templates/data/" not in text.replace(str(TEMPLATES), "")
    if text.startswith("# yaml-language-server: $schema="):
        schema = Path(text.splitlines()[0].split("$schema=")[1])
        assert schema.is_file() and schema.parent.name == "schemas"


def test_a_chain_copied_names_its_stages_templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    target, named = templates.copy("chain/rlhf-tiny", "chain.yaml")
    assert named == ["sft/tiny", "eval/sft-tiny", "reward/tiny", "ppo/rlhf-tiny"]
    assert "  sft:\n    spec: sft/tiny\n" in target.read_text()
    # a file beside the chain comes first
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft/tiny").write_text(
        (TEMPLATES / "sft/tiny.yaml").read_text().replace("max_steps: 40", "max_steps: 3")
    )
    assert load_chain("chain.yaml").stages[0].spec.training["max_steps"] == 3
    # beside the chain's file, wherever the command runs
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert load_chain("../chain.yaml").stages[0].spec.training["max_steps"] == 3
    assert load_chain("../chain.yaml").stages[2].spec.data.train.path == str(TEMPLATES / "data/preference.jsonl")
    (tmp_path / "typo.yaml").write_text("algorithm: chain\noutput_dir: outputs/typo\nstages: {sft: {spec: sft/tny}}\n")
    with pytest.raises(SpecError, match=r"^stages.sft.spec: no such file: ../sft/tny$"):
        load_chain("../typo.yaml")


def test_a_copy_goes_in_a_folder_and_replaces_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    target, named = templates.copy("sft/tiny", "mine")
    assert target == Path("mine/tiny.yaml") and named == [str(TEMPLATES / "data/sft_chat.jsonl")]
    assert "# torchx run -s local_cwd posttrain.sft --spec mine/tiny.yaml\n" in target.read_text()
    with pytest.raises(ValueError, match=r"^mine/tiny.yaml exists; name another file, or remove it first$"):
        templates.copy("sft/tiny", "mine")
    with pytest.raises(ValueError, match=r"^no template 'sft/tny'; "):
        templates.copy("sft/tny", "x.yaml")
    # a file here is not a template
    (tmp_path / "mine/tiny.yaml").rename(tmp_path / "own.yaml")
    with pytest.raises(ValueError, match=r"^no template 'own.yaml'"):
        templates.copy("own.yaml", "x.yaml")
    with pytest.raises(ValueError, match=r"^nowhere/x.yaml: no folder nowhere; make it first$"):
        templates.copy("sft/tiny", "nowhere/x.yaml")
    # a task file beside the templates is none
    with pytest.raises(ValueError, match=r"^no template 'eval/tasks/answer_form'"):
        templates.copy("eval/tasks/answer_form", "x.yaml")
    # the copy names them as a job run from where it was made finds them: from a checkout's root, as written
    monkeypatch.chdir(REPO)
    target, named = templates.copy("sft/tiny", str(tmp_path / "there.yaml"))
    assert named == ["templates/data/sft_chat.jsonl"]
