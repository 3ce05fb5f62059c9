"""README's code, run: every shell command and Python snippet in README.md is executed here, or listed with why not.

A small parser reads README's fenced blocks: ```shell / ```console / ```bash give commands (``\\``
continuations joined, ``#`` comments dropped, ``$`` prompts read with the output shown after them),
```python gives snippets, ```yaml gives spec fragments (validated), an untagged block is output (or a
``$`` transcript). Each command is then

- run as written, from a scratch directory that links ``templates/`` and ``components/`` of the
  checkout, so the relative ``outputs/...`` of README's commands land in a temp dir;
- run with ``--dryrun`` inserted after ``torchx run -s X`` where it needs a cluster, GPUs or a hub
  download (and with its ``<placeholders>`` filled in);
- or listed in :data:`LISTED` / :data:`SET_UP` with the reason it is not run.

A README command that is none of these fails :func:`test_every_readme_command_is_run_or_listed`.
The runs happen once, in README order, in one directory (later commands read earlier ones'
``outputs/``), in the module fixture :func:`readme_runs`; a test per command checks its result.
"""

import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import pytest
import yaml
from helpers import REPO, job_env

README = REPO / "README.md"

SHELL_LANGUAGES = ("shell", "console", "bash", "sh")

# Commands not run, by prefix of their text (as parsed: continuations joined, comments dropped).
LISTED: Dict[str, str] = {
    "pytest": "the suite itself: this test is part of it",
    "NODES=2 ACCOUNTING=1 bash schedulers_config/slurm_up.sh": (
        "brings up a Slurm cluster and exports SLURM_CONF for it: infrastructure, which .ci/run sets up for "
        "tests/test_slurm.py"
    ),
    "bash schedulers_config/slurm_up.sh down": "stops that Slurm cluster: infrastructure (.ci/run does it)",
    "torchx status slurm://torchx/<job id>": (
        "needs the id of a live Slurm job; tests/test_slurm.py runs torchx status and log on real ones"
    ),
    "docker build ": "needs a Docker daemon and a registry to push to",
    "python3 -m venv .venv-vllm": "builds the vLLM environment: .ci/run builds it and runs the vLLM tests there",
    "torchx run -s local_cwd posttrain.grpo --spec templates/grpo/tiny-vllm.yaml": (
        "needs the vLLM environment: tests/test_vllm.py runs this template there (.ci/run)"
    ),
    "torchx run -s local_cwd posttrain.grpo --spec templates/grpo/tiny-vllm-server.yaml": (
        "needs the vLLM environment: tests/test_vllm.py runs this template there (.ci/run)"
    ),
}
# Set-up steps a `&&` chain may begin with: not run (the environment running this test is what they
# make); the rest of the chain is planned like any command.
SET_UP: Dict[str, str] = {
    "python3 -m venv ": "creates the virtual environment",
    "python -m venv ": "creates the virtual environment",
    ". .venv/bin/activate": "activates it",
    "source .venv/bin/activate": "activates it",
    "pip install ": "installs packages",
}
CLUSTER_SCHEDULERS = ("slurm", "kubernetes", "kubernetes_mcad", "aws_batch", "gcp_batch", "ray", "lsf")
# What the scratch directory links from the checkout: the templates (specs and their data) and
# components/ (the schemas the templates name).
LINKED = ("templates", "components")
COMMAND_TIMEOUT_S = 600


# --- parsing ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    line: int  # README line where it starts
    text: str  # continuations joined, comments dropped
    output: Tuple[str, ...] = ()  # what a `$` transcript shows it printing


@dataclass(frozen=True)
class Snippet:
    line: int  # README line of its first line of code
    code: str


@dataclass(frozen=True)
class Block:
    line: int  # README line of the opening fence
    language: str
    lines: Tuple[str, ...]


def fenced_blocks(text: str) -> List[Block]:
    blocks, opened, language, body = [], None, "", []
    for number, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^```\s*([\w+-]*)\s*$", line)
        if opened is None and fence:
            opened, language, body = number, fence.group(1).lower(), []
        elif opened is not None and line.strip() == "```":
            blocks.append(Block(opened, language, tuple(body)))
            opened = None
        elif opened is not None:
            body.append(line)
    if opened is not None:
        raise ValueError(f"README line {opened}: a fenced block is never closed")
    return blocks


def strip_comment(line: str) -> str:
    """The line without a trailing ``# comment`` (a ``#`` outside quotes, after whitespace or first)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def shell_commands(block: Block) -> List[Command]:
    """A shell block's commands; in a transcript (lines with ``$`` prompts), the lines after each are its output."""
    transcript = any(line.startswith("$ ") for line in block.lines)
    commands: List[Command] = []
    pending, start, output = "", 0, []

    def close() -> None:
        nonlocal pending, output
        if pending:
            commands.append(Command(start, pending, tuple(output)))
        pending, output = "", []

    for offset, raw in enumerate(block.lines, 1):
        number = block.line + offset
        if transcript and not pending and not raw.startswith("$ "):
            if commands and raw.strip():  # the previous command's output
                last = commands[-1]
                commands[-1] = Command(last.line, last.text, last.output + (raw.rstrip(),))
            continue
        line = raw[2:] if transcript and raw.startswith("$ ") else raw
        line = strip_comment(line).strip()
        if not line and not pending:
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        pending = (pending + line).strip()
        close()
    close()
    return commands


@dataclass
class ReadmeCode:
    commands: List[Command] = field(default_factory=list)
    snippets: List[Snippet] = field(default_factory=list)
    yaml_blocks: List[Block] = field(default_factory=list)
    output_blocks: List[Block] = field(default_factory=list)


def parse_readme(text: str) -> ReadmeCode:
    code = ReadmeCode()
    for block in fenced_blocks(text):
        transcript = any(line.startswith("$ ") for line in block.lines)
        if block.language in SHELL_LANGUAGES or (block.language in ("", "text") and transcript):
            code.commands += shell_commands(block)
        elif block.language == "python":
            code.snippets.append(Snippet(block.line + 1, "\n".join(block.lines) + "\n"))
        elif block.language in ("yaml", "yml"):
            code.yaml_blocks.append(block)
        elif block.language in ("", "text"):
            code.output_blocks.append(block)
        else:
            raise ValueError(f"README line {block.line}: a ```{block.language} block this test neither runs nor reads")
    return code


def ci_command(text: str) -> str:
    """What .ci/run runs: the second line of README's first ```shell block."""
    shell = [block for block in fenced_blocks(text) if block.language == "shell"]
    return shell[0].lines[1].strip() if shell and len(shell[0].lines) > 1 else ""


# --- planning ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    command: Command
    how: str  # "run" (as written or adapted: see changes), "duplicate", "listed", "unknown"
    argv: Tuple[str, ...] = ()  # what runs
    why: str = ""  # listed, duplicate or unknown: the reason
    changes: Tuple[str, ...] = ()  # how argv differs from README's text, and why

    @property
    def dryrun(self) -> bool:
        return self.argv[:2] == ("torchx", "run") and "--dryrun" in self.argv[: self.component_index()]

    def component_index(self) -> int:
        return next((i for i, arg in enumerate(self.argv) if arg.startswith("posttrain.")), len(self.argv))


def fill_placeholders(text: str) -> Tuple[str, List[str]]:
    """``<registry>/posttrain:<tag>`` -> ``registry/posttrain:tag``, ``<pvc name>`` -> ``pvc-name``."""
    found = re.findall(r"<[^<>]+>", text)
    filled = re.sub(r"<([^<>]+)>", lambda m: re.sub(r"\W+", "-", m.group(1)), text)
    return filled, found


def option(argv: Sequence[str], *names: str) -> Optional[str]:
    for i, arg in enumerate(argv):
        if arg in names and i + 1 < len(argv):
            return argv[i + 1]
        for name in names:
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def is_local_path(value: str) -> bool:
    return value.startswith(("builtin:", "/", "./", "../", "outputs/")) or (REPO / value).exists()


def hub_names(template: Dict[str, Any]) -> List[str]:
    """What a template would download from the hub: models and data sets named by hub id."""
    models = [
        (template.get("model") or {}).get("name_or_path"),
        template.get("teacher_model"),
        template.get("reference_model"),
        *[reward.get("model") for reward in template.get("rewards") or [] if isinstance(reward, dict)],
    ]
    names = [m for m in models if isinstance(m, str) and not is_local_path(m)]
    data = template.get("data") or {}
    parts = [data.get("train"), data.get("eval")]
    names += [part["name"] for part in parts if isinstance(part, dict) and part.get("name")]
    return names


def why_not_here(component_args: Sequence[str], scheduler: Optional[str]) -> Optional[str]:
    """Why a ``torchx run`` cannot run for real on this CPU machine, or None."""
    if scheduler in CLUSTER_SCHEDULERS:
        return f"needs a {scheduler} cluster"
    gpu = option(component_args, "--gpu")
    if gpu is not None and int(gpu) > 0:
        return f"asks for {gpu} GPUs"
    resource = option(component_args, "-h")
    if resource is not None and resource.startswith("gpu."):
        return f"asks for the GPU host {resource}"
    spec = option(component_args, "--spec")
    if spec is not None and (REPO / spec).is_file():
        template = yaml.safe_load((REPO / spec).read_text())
        names = hub_names(template)
        if names and not Path(spec).stem.startswith("tiny"):
            return f"{spec} downloads {', '.join(names)} from the hub (and wants GPUs)"
        if (template.get("distributed") or {}).get("fsdp") is not None:
            return f"{spec} shards with FSDP, which runs on GPUs only"
    return None


def plan_torchx(command: Command, argv: List[str], changes: List[str]) -> Plan:
    if argv[1:2] != ["run"]:
        return Plan(command, "unknown", why="a torchx command other than run")
    component = next((i for i, arg in enumerate(argv) if arg.startswith("posttrain.")), None)
    if component is None:
        return Plan(command, "unknown", why="torchx run of no posttrain component")
    torchx_args, component_args = argv[:component], argv[component + 1 :]
    scheduler = option(torchx_args, "-s", "--scheduler")
    if "--help" not in component_args and "--dryrun" not in torchx_args:
        reason = why_not_here(component_args, scheduler)
        if reason:
            named = [i for i, arg in enumerate(torchx_args) if arg in ("-s", "--scheduler")]
            at = named[0] + 2 if named else 2
            torchx_args = [*torchx_args[:at], "--dryrun", *torchx_args[at:]]
            changes.append(f"--dryrun: {reason}")
    if scheduler == "kubernetes" and option(torchx_args, "--workspace") is None:
        torchx_args = [*torchx_args[:2], "--workspace", "", *torchx_args[2:]]
        changes.append(
            "--workspace '': torchx's default workspace builds an image of the directory with Docker even "
            "under --dryrun, and this machine has no Docker daemon"
        )
    return Plan(command, "run", tuple([*torchx_args, argv[component], *component_args]), changes=tuple(changes))


def plan_one(command: Command, text: str, ci: str) -> Plan:
    if text == ci:
        return Plan(command, "listed", why="CI's command: .ci/run runs this line, as written, on a clean clone")
    for prefix, reason in LISTED.items():
        if text.startswith(prefix):
            return Plan(command, "listed", why=reason)
    parts = [part.strip() for part in text.split("&&")]
    if len(parts) > 1:
        unknown = [part for part in parts[:-1] if not part.startswith(tuple(SET_UP))]
        if unknown:
            return Plan(command, "unknown", why=f"a chain whose step {unknown[0]!r} is not a known set-up step")
        tail = plan_one(command, parts[-1], ci)
        skipped = f"set-up not run (this test runs in the environment it makes): {' && '.join(parts[:-1])}"
        return Plan(tail.command, tail.how, tail.argv, tail.why, (skipped, *tail.changes))
    if any(char in text for char in ";|`$") or re.search(r"(^|\s)\w+=\S", text.split(" ", 1)[0]):
        return Plan(command, "unknown", why="shell syntax (;, |, $, VAR=value prefixes) this test does not run")
    filled, placeholders = fill_placeholders(text)
    changes = [f"placeholders filled in: {', '.join(placeholders)}"] if placeholders else []
    argv = shlex.split(filled)
    if argv[0] == "torchx":
        return plan_torchx(command, argv, changes)
    if argv[:2] == ["python", "-m"] and len(argv) > 2 and argv[2].startswith("posttrain."):
        return Plan(command, "run", tuple(argv), changes=tuple(changes))
    return Plan(command, "unknown", why=f"{argv[0]} is neither run by this test nor listed")


def plan_commands(commands: Sequence[Command], ci: str) -> List[Plan]:
    plans, seen = [], {}
    for command in commands:
        plan = plan_one(command, command.text, ci)
        if plan.how == "run" and not command.output:
            if plan.argv in seen:  # the same component, template and overrides: runs once
                why = f"the same as README line {seen[plan.argv]}"
                plan = Plan(command, "duplicate", plan.argv, why, plan.changes)
            else:
                seen[plan.argv] = command.line
        plans.append(plan)
    return plans


README_TEXT = README.read_text()
CODE = parse_readme(README_TEXT)
PLANS = plan_commands(CODE.commands, ci_command(README_TEXT))
RUN = [plan for plan in PLANS if plan.how in ("run", "duplicate")]
Item = Union[Plan, Snippet]


def item_line(item: Item) -> int:
    return item.command.line if isinstance(item, Plan) else item.line


ITEMS: List[Item] = sorted([*RUN, *CODE.snippets], key=item_line)


def item_id(item: Item) -> str:
    text = shlex.join(item.argv) if isinstance(item, Plan) else "python"
    return f"L{item_line(item)}-" + re.sub(r"[^\w.=/-]+", "_", text)[:80]


# --- fast checks: the parser, the plan, the YAML ---------------------------------------------------


def test_parser_reads_commands_transcripts_and_snippets() -> None:
    text = "\n".join([
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
    ])  # fmt: skip
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
        "torchx", "run", "-s", "slurm", "--dryrun"
    )  # fmt: skip
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
    unknown = [f"README line {p.command.line}: {p.command.text}\n  ({p.why})" for p in PLANS if p.how == "unknown"]
    assert not unknown, (
        "README commands this test neither runs nor lists (run them from tests/test_readme.py, or add them "
        "to LISTED with the reason):\n" + "\n".join(unknown)
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
    from posttrain.components.spec import validate

    assert CODE.yaml_blocks, "README has no YAML blocks"
    for block in CODE.yaml_blocks:
        fragment = yaml.safe_load("\n".join(block.lines))
        assert isinstance(fragment, dict), f"README line {block.line}: not a mapping"
        if "algorithm" in fragment:
            distributed = fragment.get("distributed") or {}
            engines = [key for key in ("deepspeed", "fsdp") if key in distributed]
            for keep in engines or [None]:
                alone = {key: value for key, value in distributed.items() if key not in engines or key == keep}
                validate(dict(fragment, distributed=alone))
        elif set(fragment) == {"rewards"}:
            for template in ("grpo/tiny.yaml", "rloo/tiny.yaml", "ppo/tiny.yaml"):
                spec = yaml.safe_load((REPO / "templates" / template).read_text())
                validate({**spec, **fragment})
        else:
            raise AssertionError(f"README line {block.line}: a YAML block this test does not know how to check")


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
                ["bash", "-c", shlex.join(argv)], cwd=workdir, env=env, capture_output=True, text=True,
                timeout=COMMAND_TIMEOUT_S,
            )  # fmt: skip
        except subprocess.TimeoutExpired as e:
            result = subprocess.CompletedProcess(argv, -9, str(e.stdout or ""), f"timeout: {COMMAND_TIMEOUT_S} s")
        ran[line] = Ran(result, time.monotonic() - begin, workdir)
        print(f"README line {line}: exit {result.returncode} in {ran[line].seconds:.1f} s: {shlex.join(argv)}")
    print(f"README: {len(ran)} runs in {time.monotonic() - started:.0f} s")
    return ran


def show(item: Item, ran: Ran) -> str:
    r = ran.result
    return f"{item_id(item)}: exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-6000:]}"


def check_png(workdir: Path, argv: Sequence[str]) -> None:
    """A plot command wrote a PNG holding each named run's curves."""
    from posttrain.components.plot import read_embedded

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
