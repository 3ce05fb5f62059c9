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
The runs are ``tests/e2e/test_readme.py``'s.
"""

import pytest
import yaml

from helpers import REPO
from readme_code import (
    CODE,
    LISTED,
    PLANS,
    README_TEXT,
    Command,
    Plan,
    Snippet,
    ci_command,
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
            "posttrain plot 'a # b' -o x.png",
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
        Command(5, "posttrain plot 'a # b' -o x.png"),
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
        "README commands this test neither runs nor lists (run them from tests/e2e/test_readme.py, or add them "
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
    a ``rewards:`` block validates in every algorithm that takes rewards, a ``generation:`` one in GRPO with its
    vllm role."""
    from posttrain.components.spec.chain import validate_chain
    from posttrain.components.spec.evaluation import validate_eval
    from posttrain.components.spec.loading import validate

    assert CODE.yaml_blocks, "README has no YAML blocks"
    for block in CODE.yaml_blocks:
        fragment = yaml.safe_load("\n".join(block.lines))
        assert isinstance(fragment, dict), f"{where(block.line)}: not a mapping"
        # its stage files as the chain templates name them
        if fragment.get("algorithm") == "chain":
            validate_chain(fragment, base=REPO / "templates" / "chain")
        elif fragment.get("algorithm") == "eval":
            validate_eval(fragment)
        elif "algorithm" in fragment:
            distributed = fragment.get("distributed") or {}
            engines = [key for key in ("deepspeed", "fsdp") if key in distributed]
            for keep in engines or [None]:
                alone = {key: value for key, value in distributed.items() if key not in engines or key == keep}
                validate(dict(fragment, distributed=alone))
        elif set(fragment) == {"data"}:
            # a data section: in the algorithm whose columns it holds
            spec = yaml.safe_load((REPO / "templates/sft/tiny.yaml").read_text())
            validate({**spec, **fragment})
        elif set(fragment) == {"generation"}:
            # GRPO's turns with its vllm role
            spec = yaml.safe_load((REPO / "templates/grpo/tiny-vllm-async.yaml").read_text())
            validate({**spec, **fragment})
        elif set(fragment) == {"rewards"}:
            for template in ("grpo/tiny.yaml", "rloo/tiny.yaml", "ppo/tiny.yaml"):
                spec = yaml.safe_load((REPO / "templates" / template).read_text())
                validate({**spec, **fragment})
        else:
            raise AssertionError(f"{where(block.line)}: a YAML block this test does not know how to check")
