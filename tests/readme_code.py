"""The code of README and the documentation site, read: fenced blocks parsed into commands, snippets and YAML, and
each command planned. README and the site's pages (in the site's order) are read as one text; a line number is
one of that text, which :func:`where` names as a file and its line.

The parser and the planner behind tests/unit/project/test_readme.py and tests/e2e/test_readme.py (which says what
is run and how); kept apart so that the tests read as tests.
"""

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import yaml

from helpers import REPO

README = REPO / "README.md"

SHELL_LANGUAGES = ("shell", "console", "bash", "sh")

# Commands not run, by prefix of their text (as parsed: continuations joined, comments dropped).
LISTED: Dict[str, str] = {
    "pytest": "the suite itself: this test is part of it",
    "ruff format . && ruff check --fix .": "rewrites the checkout; tests/integration/test_format.py runs ruff's checks",
    "NODES=2 ACCOUNTING=1 bash schedulers_config/slurm_up.sh": (
        "brings up a Slurm cluster and exports SLURM_CONF for it: infrastructure, which .ci/run sets up for "
        "tests/e2e/test_slurm.py"
    ),
    "bash schedulers_config/slurm_up.sh down": "stops that Slurm cluster: infrastructure (.ci/run does it)",
    "torchx status slurm://torchx/<job id>": (
        "needs the id of a live Slurm job; tests/e2e/test_slurm.py runs torchx status and log on real ones"
    ),
    "docker build ": "needs a Docker daemon and a registry to push to",
    "tensorboard --logdir": "starts a server; docs/pages/logging.md's snippet reads the same events",
    "export WANDB_API_KEY=": "sets a secret in the submitting shell: there is no W&B account here",
    "pip install -e '.[gpu]'": (
        "installs GPU packages into the environment running the tests (CI has no GPU); "
        "tests/unit/speed/test_fast_paths.py reads the gpu extra"
    ),
    "pip install 'posttrain[tasks]'": "installs reasoning-gym, which the test extra installs for this test already",
    "python3 -m venv .venv-vllm": "builds the vLLM environment: .ci/run builds it and runs the vLLM tests there",
    "torchx run -s local_cwd posttrain.grpo --spec templates/grpo/tiny-vllm.yaml": (
        "needs the vLLM environment: tests/e2e/test_vllm.py runs this template there (.ci/run)"
    ),
    "torchx run -s local_cwd posttrain.grpo --spec templates/grpo/tiny-vllm-server.yaml": (
        "needs the vLLM environment: tests/e2e/test_vllm.py runs this template there (.ci/run)"
    ),
    "torchx run -s local_cwd posttrain.grpo --spec templates/grpo/tiny-vllm-async.yaml": (
        "needs the vLLM environment: tests/e2e/test_vllm.py runs this template there (.ci/run)"
    ),
    "torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny-evaluated.yaml": (
        "tests/e2e/test_eval.py runs this template and reads its closing line and its evaluation"
    ),
    "torchx run -s local_cwd posttrain.eval --spec templates/eval/sft-tiny.yaml": (
        "tests/e2e/test_eval.py runs this evaluation (of the session's tiny SFT model) and reads its line"
    ),
    "torchx run -s local_cwd posttrain.eval --spec templates/eval/benchmarks-tiny.yaml": (
        "tests/e2e/test_eval.py runs this evaluation (of the session's tiny SFT model) and reads its line"
    ),
    "torchx run -s local_cwd posttrain.chain --spec templates/chain/reasoning-tiny.yaml": (
        "tests/e2e/test_reasoning.py runs this chain, checks its gate's order and every sample's score by hand"
    ),
    "torchx run -s local_cwd posttrain.chain --spec templates/chain/tools-tiny.yaml": (
        "tests/e2e/test_tools.py runs this chain (and its GRPO stage without the tool), tests/e2e/test_vllm.py "
        "with vLLM (.ci/run)"
    ),
}
# Commands not run where written whole, as a test runs them already (the same command with more arguments runs).
LISTED_WHOLE: Dict[str, str] = {
    "torchx run -s local_cwd posttrain.chain --spec templates/chain/rlhf-tiny.yaml": (
        "tests/e2e/test_chain.py runs this chain (killed during its reward stage and run again) and reads every stage"
    ),
    # the three commands of docs/pages/rewards-and-ppo.md's RLHF, the chain's stages: the chain runs these templates
    "torchx run -s local_cwd posttrain.reward --spec templates/reward/tiny.yaml": (
        "tests/e2e/test_chain.py's RLHF chain runs this template as its reward stage (and tests/conftest.py's "
        "reward_model for the reward tests)"
    ),
    "torchx run -s local_cwd posttrain.ppo    --spec templates/ppo/rlhf-tiny.yaml": (
        "tests/e2e/test_chain.py's RLHF chain runs this template as its ppo stage, from its sft and reward stages"
    ),
    "torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny-zero2.yaml -j 2x1 --launcher deepspeed": (
        "tests/e2e/test_distributed.py runs this command and reads both nodes' logs and the run"
    ),
    # README's "From an installed package"
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install <a posttrain "
    "checkout or wheel>": (
        "installs posttrain (not editable): tests/e2e/test_installed.py builds its wheel and installs it in a fresh "
        "environment"
    ),
    **dict.fromkeys(
        (
            "torchx run -s local_cwd posttrain.sft --spec sft/tiny",
            "torchx run -s local_cwd posttrain.dpo --spec dpo/tiny model.name_or_path=outputs/sft-tiny",
            "posttrain templates cp sft/tiny my-sft.yaml",
            "torchx run -s local_cwd posttrain.sft --spec my-sft.yaml",
        ),
        "tests/e2e/test_installed.py runs this from a wheel installed in a fresh environment, in an empty directory",
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
    # README line where it starts
    line: int
    # continuations joined, comments dropped
    text: str
    # what a `$` transcript shows it printing
    output: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Snippet:
    # README line of its first line of code
    line: int
    code: str


@dataclass(frozen=True)
class Block:
    # README line of the opening fence
    line: int
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
        raise ValueError(f"{where(opened)}: a fenced block is never closed")
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
            # the previous command's output
            if commands and raw.strip():
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
    # example rows of data: tests/unit/project/test_docs.py loads each through the job's data checks
    data_blocks: List[Block] = field(default_factory=list)


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
        elif block.language == "jsonl":
            code.data_blocks.append(block)
        else:
            raise ValueError(f"{where(block.line)}: a ```{block.language} block this test neither runs nor reads")
    return code


def ci_command(text: str) -> str:
    """What .ci/run runs: the second line of README's first ```shell block."""
    shell = [block for block in fenced_blocks(text) if block.language == "shell"]
    return shell[0].lines[1].strip() if shell and len(shell[0].lines) > 1 else ""


# --- planning ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    command: Command
    # "run" (as written or adapted: see changes), "duplicate", "listed", "unknown"
    how: str
    # what runs
    argv: Tuple[str, ...] = ()
    # listed, duplicate or unknown: the reason
    why: str = ""
    # how argv differs from README's text, and why
    changes: Tuple[str, ...] = ()

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
    return Plan(command, "run", tuple([*torchx_args, argv[component], *component_args]), changes=tuple(changes))


def plan_one(command: Command, text: str, ci: str) -> Plan:
    if text == ci:
        return Plan(command, "listed", why="CI's command: .ci/run runs this line, as written, on a clean clone")
    for prefix, reason in LISTED.items():
        if text.startswith(prefix):
            return Plan(command, "listed", why=reason)
    if text in LISTED_WHOLE:
        return Plan(command, "listed", why=LISTED_WHOLE[text])
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
    # the posttrain command (its console script), or a posttrain module
    if argv[0] == "posttrain" or argv[:2] == ["python", "-m"] and len(argv) > 2 and argv[2].startswith("posttrain."):
        return Plan(command, "run", tuple(argv), changes=tuple(changes))
    return Plan(command, "unknown", why=f"{argv[0]} is neither run by this test nor listed")


def plan_commands(commands: Sequence[Command], ci: str) -> List[Plan]:
    plans, seen = [], {}
    for command in commands:
        plan = plan_one(command, command.text, ci)
        if plan.how == "run" and not command.output:
            # the same component, template and overrides: runs once
            if plan.argv in seen:
                why = f"the same as {where(seen[plan.argv])}"
                plan = Plan(command, "duplicate", plan.argv, why, plan.changes)
            else:
                seen[plan.argv] = command.line
        plans.append(plan)
    return plans


README_TEXT = README.read_text()
DOCS = REPO / "docs"
# README, then the site's pages in the order its nav lists them
PAGES = [README] + [
    DOCS / "pages" / page for page in re.findall(r":\s*(\S+\.md)\s*$", (DOCS / "mkdocs.yml").read_text(), re.M)
]
_TEXTS = [page.read_text() for page in PAGES]
_STARTS = [sum(text.count("\n") for text in _TEXTS[:index]) for index in range(len(_TEXTS))]


def where(line: int) -> str:
    """A line of the combined text as its file and line: ``docs/pages/spec.md:12``."""
    index = max(i for i, start in enumerate(_STARTS) if start < line)
    return f"{PAGES[index].relative_to(REPO)}:{line - _STARTS[index]}"


CODE = parse_readme("".join(_TEXTS))
PLANS = plan_commands(CODE.commands, ci_command(README_TEXT))
RUN = [plan for plan in PLANS if plan.how in ("run", "duplicate")]
Item = Union[Plan, Snippet]


def item_line(item: Item) -> int:
    return item.command.line if isinstance(item, Plan) else item.line


ITEMS: List[Item] = sorted([*RUN, *CODE.snippets], key=item_line)


def item_id(item: Item) -> str:
    text = shlex.join(item.argv) if isinstance(item, Plan) else "python"
    return f"L{item_line(item)}-" + re.sub(r"[^\w.=/-]+", "_", text)[:80]
