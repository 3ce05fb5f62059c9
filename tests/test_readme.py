"""README's code, run: every shell command and Python snippet in README.md is executed here, or listed with why not.

A small parser reads README's fenced blocks: ```shell / ```console / ```bash give commands (``\\``
continuations joined, ``#`` comments dropped, ``$`` prompts read with the output shown after them),
```python gives snippets, ```yaml gives spec fragments (validated), an untagged block is output (or a
``$`` transcript). Each command is then

- run as written, from a scratch directory that links ``templates/`` and ``components/`` of the
  checkout, so the relative ``outputs/...`` of README's commands land in a temp dir;
- run with ``--dryrun`` inserted after ``torchx run -s X`` where it needs a cluster, GPUs or a hub
  download (and with its ``<placeholders>`` filled in);
- or listed in ``LISTED`` / ``SET_UP`` (``readme_code.py``, the parser and planner) with the reason it is
  not run.

A README command that is none of these fails :func:`test_every_readme_command_is_run_or_listed`.
The runs happen once, in README order, in one directory (later commands read earlier ones'
``outputs/``), in the module fixture :func:`readme_runs`; a test per command checks its result.
"""

import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Sequence

import pytest
import yaml

from helpers import REPO, job_env
from readme_code import (
    CODE,
    COMMAND_TIMEOUT_S,
    ITEMS,
    LINKED,
    LISTED,
    PLANS,
    README_TEXT,
    RUN,
    Command,
    Item,
    Plan,
    Snippet,
    ci_command,
    item_id,
    option,
    parse_readme,
    plan_one,
    where,
)

# --- fast checks: the parser, the plan, the YAML ---------------------------------------------------


def test_parser_reads_commands_transcripts_and_snippets() -> None:
    text = "\n".join(
        [
            "```shell",
            "# a comment line",
            "torchx run -s local_cwd posttrain.sft \\",
            "    --spec templates/sft/tiny.yaml   # trailing comment",
            "python -m posttrain.components.plot 'a # b' -o x.png",
            "```",
            "```",
            "$ torchx run posttrain.sft bad=1",
            "bad: unknown key",
            "```",
            "```",
            "just output",
            "```",
            "```python",
            "print(1)",
            "```",
        ]
    )
    code = parse_readme(text)
    assert code.commands == [
        Command(3, "torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml"),
        Command(5, "python -m posttrain.components.plot 'a # b' -o x.png"),
        Command(8, "torchx run posttrain.sft bad=1", ("bad: unknown key",)),
    ]
    assert code.snippets == [Snippet(15, "print(1)\n")]
    assert [block.lines for block in code.output_blocks] == [("just output",)]
    with pytest.raises(ValueError, match="neither runs nor reads"):
        parse_readme("```ruby\nputs 1\n```\n")


def test_plans_insert_dryrun_where_a_run_needs_a_cluster_gpus_or_the_hub() -> None:
    def plan(text: str) -> Plan:
        return plan_one(Command(1, text), text, ci="")

    assert plan("torchx run -s slurm posttrain.sft --spec templates/sft/tiny.yaml").argv[:5] == (
        "torchx",
        "run",
        "-s",
        "slurm",
        "--dryrun",
    )
    assert plan("torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml -j 1x2 --gpu 2").dryrun
    assert plan("torchx run -s local_cwd posttrain.sft --spec templates/sft/qwen2.5-0.5b.yaml").dryrun
    assert plan("torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny-fsdp.yaml").dryrun
    assert not plan("torchx run -s local_cwd posttrain.ppo --spec templates/ppo/rlhf-tiny.yaml").dryrun
    assert not plan("torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml --gpu 0").dryrun
    assert plan("curl https://example.com").how == "unknown"
    assert plan("python3 -m venv .venv && rm -rf /").how == "unknown"
    chain = plan("python3 -m venv .venv && . .venv/bin/activate && torchx run -s local_cwd posttrain.sft --spec a.yaml")
    assert chain.how == "run" and chain.argv[:2] == ("torchx", "run")


def test_every_readme_command_is_run_or_listed() -> None:
    assert len(CODE.commands) >= 10 and CODE.snippets, "the parser found next to nothing in README.md"
    unknown = [f"{where(p.command.line)}: {p.command.text}\n  ({p.why})" for p in PLANS if p.how == "unknown"]
    assert not unknown, (
        "README commands this test neither runs nor lists (run them from tests/test_readme.py, or add them "
        "to LISTED in tests/readme_code.py with the reason):\n" + "\n".join(unknown)
    )
    listed = [plan.command.text for plan in PLANS if plan.how == "listed"]
    stale = [prefix for prefix in LISTED if not any(text.startswith(prefix) for text in listed)]
    assert not stale, f"LISTED names commands README no longer has: {stale}"
    ci = ci_command(README_TEXT)
    assert ci.endswith("pytest") or " pytest" in ci, f".ci/run would run {ci!r}, not the suite"
    assert any(plan.command.text == ci and plan.how == "listed" for plan in PLANS)
    first = next(plan for plan in PLANS if plan.command.line == CODE.commands[0].line)
    assert first.how == "run" and first.argv[:2] == ("torchx", "run"), "the first command's tail must run"


def test_readme_yaml_blocks_are_valid_spec_fragments() -> None:
    """A full spec validates (one of distributed.deepspeed/fsdp at a time: they exclude each other);
    a ``rewards:`` block validates in every algorithm that takes rewards."""
    from posttrain.components.spec.loading import validate

    assert CODE.yaml_blocks, "README has no YAML blocks"
    for block in CODE.yaml_blocks:
        fragment = yaml.safe_load("\n".join(block.lines))
        assert isinstance(fragment, dict), f"{where(block.line)}: not a mapping"
        if "algorithm" in fragment:
            distributed = fragment.get("distributed") or {}
            engines = [key for key in ("deepspeed", "fsdp") if key in distributed]
            for keep in engines or [None]:
                alone = {key: value for key, value in distributed.items() if key not in engines or key == keep}
                validate(dict(fragment, distributed=alone))
        elif set(fragment) == {"data"}:  # a data section: in the algorithm whose columns it holds
            spec = yaml.safe_load((REPO / "templates/sft/tiny.yaml").read_text())
            validate({**spec, **fragment})
        elif set(fragment) == {"rewards"}:
            for template in ("grpo/tiny.yaml", "rloo/tiny.yaml", "ppo/tiny.yaml"):
                spec = yaml.safe_load((REPO / "templates" / template).read_text())
                validate({**spec, **fragment})
        else:
            raise AssertionError(f"{where(block.line)}: a YAML block this test does not know how to check")


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
    from posttrain.entrypoints.curves import read_embedded

    png = workdir / option(argv, "-o", "--output")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png} is not a PNG"
    positional, skip = [], False
    for arg in argv[3:]:
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
    if plan.command.output and plan.command.output[0].startswith("torchx "):  # a whole console, as a run printed it
        shown_out = [line for line in plan.command.output if re.match(r"^\w+://torchx/", line)]  # the app handle
        shown_err = [line for line in plan.command.output if line not in shown_out]
        assert normalised("\n".join(shown_out)) == normalised(result.stdout), show(plan, ran)
        assert normalised("\n".join(shown_err)) == normalised(result.stderr), show(plan, ran)
        failed = any("Job finished: FAILED" in line for line in shown_err)
        assert result.returncode == (1 if failed else 0), show(plan, ran)  # the exit codes the page states
        return
    if plan.command.output:  # a transcript: it prints what README shows
        missing = [line for line in plan.command.output if line.strip() not in output]
        assert not missing, f"README shows {missing}, not printed\n" + show(plan, ran)
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
    elif argv[:3] == ("python", "-m", "posttrain.components.plot"):
        check_png(ran.workdir, argv)
