"""posttrain installed from its wheel, not cloned (docs: First run): from an empty directory, the shipped templates
run by name, the ``posttrain`` command lists them and copies one, and the copy, edited, runs; the wheel holds every
file the templates name."""

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Iterator, List

import pytest
import yaml

from helpers import REPO, TEMPLATES, assert_succeeded, ends, free_port, job_env, read_json

pytestmark = pytest.mark.e2e


def checkout_files() -> List[str]:
    """The checkout's files, as git sees them (tracked, or new and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, text=True
    )
    return [name for name in listed.stdout.split() if (REPO / name).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel pip builds from the checkout's files (copied: a build in the checkout keeps what an earlier build
    copied to build/, templates since removed included)."""
    root = tmp_path_factory.mktemp("wheel")
    for name in checkout_files():
        (root / "source" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "source" / name).write_bytes((REPO / name).read_bytes())
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(root)]
    subprocess.run([*build, str(root / "source")], check=True, capture_output=True)
    [built] = root.glob("posttrain-*.whl")
    return built


@pytest.fixture(scope="module")
def python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh environment's interpreter: the wheel installed in it, this environment's packages (torch, TRL, ...)
    reused through a .pth file, which adds their folder after its own (so the wheel's posttrain is the one found)."""
    root = tmp_path_factory.mktemp("environment")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = Path(sysconfig.get_paths(vars={"base": str(root), "platbase": str(root)})["purelib"])
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site)]
    subprocess.run([*install, str(wheel)], check=True, capture_output=True)
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # the wheel's console script, as pip run by this environment would install it: naming its interpreter (pip
    # --target names the one that ran it)
    script = (site / "bin" / "posttrain").read_text().split("\n", 1)[1]
    (root / "bin" / "posttrain").write_text(f"#!{root / 'bin' / 'python'}\n{script}")
    (root / "bin" / "posttrain").chmod(0o755)
    return root / "bin" / "python"


def in_empty_directory(
    python: Path, args: List[str], work: Path, program: str = "python"
) -> subprocess.CompletedProcess:
    """``PROGRAM ARGS`` (the installed environment's) in ``work``, that environment first on PATH (the job's
    ``python`` is its)."""
    env = job_env(work.parent)
    env["PATH"] = f"{python.parent}:{env['PATH']}"
    command = [str(python.with_name(program)), *args]
    return subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)


def torchx_run(python: Path, algorithm: str, spec: str, work: Path, *overrides: str) -> subprocess.CompletedProcess:
    args = ["-m", "torchx.cli.main", "run", "-s", "local_cwd", f"posttrain.{algorithm}", "--spec", spec]
    return in_empty_directory(python, [*args, "--rdzv_port", str(free_port()), *overrides], work)


def shipped_strings(value: object) -> Iterator[str]:
    if isinstance(value, dict):
        for item in value.values():
            yield from shipped_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from shipped_strings(item)
    elif isinstance(value, str) and value.startswith("templates/"):
        yield value


def test_the_wheel_holds_every_template_and_every_file_they_name(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = sorted(TEMPLATES.glob("*/*.yaml"))
    assert {f"posttrain/{path.relative_to(REPO)}" for path in templates} <= names
    named = {text for path in templates for text in shipped_strings(yaml.safe_load(path.read_text()))}
    assert "templates/data/sft_chat.jsonl" in named and "templates/eval/tasks" in named
    for text in named:
        files = [path for path in [REPO / text, *(REPO / text).rglob("*")] if path.is_file()]
        assert files and {f"posttrain/{path.relative_to(REPO)}" for path in files} <= names, text
    # and the checkout's templates/ is their only copy
    shipped = {path.name for path in TEMPLATES.rglob("*") if path.suffix in (".yaml", ".jsonl")}
    assert not [name for name in checkout_files() if not name.startswith("templates/") and Path(name).name in shipped]


def test_an_installed_posttrain_runs_lists_and_copies_its_templates(python: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    found = in_empty_directory(
        python, ["-c", "import posttrain.components; print(posttrain.components.__file__)"], work
    )
    assert Path(found.stdout.strip()).is_relative_to(python.parents[1]), found

    # a template by name: its data are the installed ones, its output lands here
    sft = torchx_run(python, "sft", "sft/tiny", work)
    assert_succeeded(sft)
    assert "posttrain: --spec sft/tiny: the shipped template " in sft.stderr
    first, last = ends(work / "outputs/sft-tiny", "loss")
    assert last < 0.7 * first, (first, last)
    data = Path(read_json(work / "outputs/sft-tiny/run_summary.json")["spec"]["data"]["train"]["path"])
    assert data.is_relative_to(python.parents[1]) and data.name == "sft_chat.jsonl"

    dpo = torchx_run(python, "dpo", "dpo/tiny", work, "model.name_or_path=outputs/sft-tiny")
    assert_succeeded(dpo)
    margin_first, margin_last = ends(work / "outputs/dpo-tiny", "rewards/margins")
    assert margin_last > 0 and margin_last > margin_first

    helped = in_empty_directory(python, ["--help"], work, program="posttrain")
    assert helped.returncode == 0 and "{templates,plot}" in helped.stdout, helped.stderr
    listed = in_empty_directory(python, ["templates", "ls"], work, program="posttrain")
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:] if not line.startswith(" ")}
    assert sorted(rows) == sorted(
        path.relative_to(TEMPLATES).with_suffix("").as_posix() for path in TEMPLATES.glob("*/*.yaml")
    )
    assert "torchx run -s local_cwd posttrain.sft --spec sft/tiny  " in rows["sft/tiny"]

    copied = in_empty_directory(python, ["templates", "cp", "sft/tiny", "my-sft.yaml"], work, program="posttrain")
    assert copied.returncode == 0, copied.stderr
    assert copied.stdout.splitlines()[0] == "copied sft/tiny to my-sft.yaml"
    text = (work / "my-sft.yaml").read_text()
    assert "# torchx run -s local_cwd posttrain.sft --spec my-sft.yaml\n" in text
    edited = text.replace("outputs/sft-tiny", "outputs/my-sft").replace("max_steps: 40", "max_steps: 12")
    (work / "my-sft.yaml").write_text(edited)
    mine = torchx_run(python, "sft", "my-sft.yaml", work)
    assert_succeeded(mine)
    assert "shipped template" not in mine.stderr
    first, last = ends(work / "outputs/my-sft", "loss")
    assert last < first and len(read_json(work / "outputs/my-sft/trainer_state.json")["log_history"]) >= 12
