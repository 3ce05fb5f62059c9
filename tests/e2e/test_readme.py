"""README's and the site's code, run: every command and snippet the parser plans (``readme_code.py``; what it
plans and why: ``tests/unit/project/test_readme.py``) runs once, in order, in one scratch directory that links the
checkout's ``templates/`` and ``components/`` (later commands read earlier ones' ``outputs/``), in the module
fixture :func:`readme_runs`; a test per command checks its result, and a shown console against the run's.
"""

import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Sequence

import pytest

from helpers import REPO, job_env
from readme_code import COMMAND_TIMEOUT_S, ITEMS, LINKED, RUN, Item, Plan, Snippet, item_id, option, where

# --- fast checks: the parser, the plan, the YAML ---------------------------------------------------


# --- the runs, in README order ---------------------------------------------------------------------


@dataclass
class Ran:
    result: subprocess.CompletedProcess
    seconds: float
    workdir: Path


@pytest.fixture(scope="module")
def readme_runs(tmp_path_factory: pytest.TempPathFactory) -> Dict[int, Ran]:
    """Runs every README command and snippet this test runs, once, in README order, in one scratch dir."""
    root = tmp_path_factory.mktemp("readme")
    workdir = root / "checkout"
    workdir.mkdir()
    for name in LINKED:
        (workdir / name).symlink_to(REPO / name)
    env = job_env(root)
    ran: Dict[int, Ran] = {}
    started = time.monotonic()
    for item in ITEMS:
        if isinstance(item, Plan) and item.how == "duplicate":
            continue
        if isinstance(item, Plan):
            line, argv = item.command.line, list(item.argv)
        else:
            line = item.line
            script = workdir / f"readme_snippet_L{line}.py"
            script.write_text(item.code)
            argv = ["python", script.name]
        begin = time.monotonic()
        try:
            result = subprocess.run(
                ["bash", "-c", shlex.join(argv)],
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as e:
            result = subprocess.CompletedProcess(argv, -9, str(e.stdout or ""), f"timeout: {COMMAND_TIMEOUT_S} s")
        ran[line] = Ran(result, time.monotonic() - begin, workdir)
        print(f"{where(line)}: exit {result.returncode} in {ran[line].seconds:.1f} s: {shlex.join(argv)}")
    print(f"README: {len(ran)} runs in {time.monotonic() - started:.0f} s")
    return ran


def show(item: Item, ran: Ran) -> str:
    r = ran.result
    return f"{item_id(item)}: exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-6000:]}"


def check_png(workdir: Path, argv: Sequence[str]) -> None:
    """A plot command wrote a PNG holding each named run's curves."""
    from posttrain.entrypoints.records.curves import read_embedded

    png = workdir / option(argv, "-o", "--output")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
    positional, skip = [], False
    for arg in argv[2:]:
        if skip or arg in ("-o", "--output"):
            skip = not skip
            continue
        positional.append(arg)
    runs = read_embedded(png)["runs"]
    assert sorted(runs) == sorted(Path(p).name for p in positional)
    assert all(series.get("loss") for series in runs.values()), runs


def normalised(console: str) -> str:
    """A console as the docs and a run are compared: what changes from run to run (times, numbers, temporary
    directories, app ids, the working directory) replaced, and the lines YAML wraps joined."""
    text = " ".join(console.split())
    for pattern, replacement in (
        (r"\d{4}-\d\d-\d\d[ _]\d\d:\d\d:\d\d(,\d+)?", "<time>"),
        (r"/tmp/torchx_\w+", "/tmp/torchx_<id>"),
        (r"torchx/([a-z_]+)-[a-z0-9]+", r"torchx/\1-<id>"),
        (r"start at [^)]+\)", "start at <cwd>)"),
        # the failed process torchrun reports first: the one that stopped (2), or one it stopped (-15) if that won
        (r"errorCode: -?\d+", "errorCode: <code>"),
        (r"loaded configs from \S+", "loaded configs from <cwd>/.torchxconfig"),
        (r"\d+(\.\d+)?(e[-+]?\d+)?", "#"),
    ):
        text = re.sub(pattern, replacement, text)
    return text


@pytest.mark.e2e
@pytest.mark.parametrize("item", ITEMS, ids=item_id)
def test_readme_code_runs(item: Item, readme_runs: Dict[int, Ran]) -> None:
    if isinstance(item, Snippet):
        ran = readme_runs[item.line]
        assert ran.result.returncode == 0, show(item, ran)
        if "runner.run(" in item.code:
            assert "SUCCEEDED" in ran.result.stdout, show(item, ran)
        return
    plan = item
    if plan.how == "duplicate":
        original = next(p for p in RUN if p.how == "run" and p.argv == plan.argv)
        ran = readme_runs[original.command.line]
    else:
        ran = readme_runs[plan.command.line]
    result, output = ran.result, ran.result.stdout + ran.result.stderr
    # a whole console, as a run printed it
    if plan.command.output and plan.command.output[0].startswith("torchx "):
        # the app handle
        shown_out = [line for line in plan.command.output if re.match(r"^\w+://torchx/", line)]
        shown_err = [line for line in plan.command.output if line not in shown_out]
        assert normalised("\n".join(shown_out)) == normalised(result.stdout), show(plan, ran)
        assert normalised("\n".join(shown_err)) == normalised(result.stderr), show(plan, ran)
        # the exit codes the page states: 1 for a job that failed or a spec the client refused (nothing scheduled)
        succeeded = any("Job finished: SUCCEEDED" in line for line in shown_err) or plan.dryrun
        assert result.returncode == (0 if succeeded else 1), show(plan, ran)
        return
    # a transcript: it prints what README shows (times, numbers and the directory aside)
    if plan.command.output:
        missing = [line for line in plan.command.output if normalised(line) not in normalised(output)]
        assert not missing, f"README shows {missing}, not printed\n" + show(plan, ran)
        refused = plan.argv[:2] == ("torchx", "run") and not re.search(r"^\w+://torchx/", result.stdout, re.M)
        # the client's one line: nothing scheduled
        if refused and not plan.dryrun and "--help" not in plan.argv:
            assert result.returncode == 1, show(plan, ran)
        return
    assert result.returncode == 0, show(plan, ran)
    argv = plan.argv
    if argv[:2] == ("torchx", "run"):
        if "--help" in argv:
            assert "usage:" in output, show(plan, ran)
        elif plan.dryrun:
            assert "=== SCHEDULER REQUEST ===" in result.stdout, show(plan, ran)
            launched = re.search(r"^\w+://torchx/\S+$", result.stdout, re.M)
            assert not launched, "--dryrun launched an app\n" + show(plan, ran)
        else:
            assert re.search(r"^local_cwd://torchx/\S+", result.stdout, re.M), "no app handle\n" + show(plan, ran)
            assert "SUCCEEDED" in output, show(plan, ran)
    elif argv[:2] == ("posttrain", "plot"):
        check_png(ran.workdir, argv)
