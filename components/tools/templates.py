"""The shipped templates: list them, and copy one to edit (the ``tune ls`` / ``tune cp`` habit).

::

    posttrain templates ls                     # list
    posttrain templates cp sft/tiny my-sft.yaml  # copy one

The list has a row per template ``<algorithm>/<name>``: its name (what ``--spec`` takes), its command
(the ``# torchx run ...`` line it opens with, run by name) and its summary (the first sentence of the comment
after the command). They are found where posttrain is installed (``posttrain.templates``: a checkout's
``templates/`` in an editable install), so the list and the copies work from any directory.

A copy names the shipped files the template uses (its data, a chain's stage specs, the schema editors check
it against) where they are installed, and its command runs the copy.
"""

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import yaml

from posttrain.components.spec.chain import stage_file
from posttrain.components.spec.shipped import TEMPLATES_DIR, installed, shipped_file, template_file

COMMAND_PREFIX = "# torchx run"


@dataclass(frozen=True)
class Template:
    """One template: its name (``sft/tiny``), its commands (run by name) and its summary."""

    name: str
    algorithm: str
    commands: Tuple[str, ...]
    description: str


def parse_header(text: str) -> Tuple[Tuple[str, ...], str]:
    """The commands a template opens with and its one-line summary.

    The summary is the first paragraph of comment after the commands, cut at
    its first sentence; a trailing clause that introduces an indented example
    (``...; on Slurm:``) is left out with the example.

    >>> parse_header('''# yaml-language-server: $schema=x.json
    ... # torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml
    ... #
    ... # SFT of a tiny model on CPU,
    ... # in a minute. Then more.
    ... algorithm: sft''')
    ... # doctest: +NORMALIZE_WHITESPACE
    (('torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml',),
     'SFT of a tiny model on CPU, in a minute.')
    >>> parse_header("# torchx run -s slurm posttrain.dpo\\n# DPO on GPUs; on Slurm:\\n#   torchx run ...\\n")[1]
    'DPO on GPUs.'
    """
    comments = []
    for line in text.splitlines():
        if not line.startswith("#"):
            # the header is the leading comment block
            break
        comments.append(line)
    commands: List[str] = []
    index = 0
    while index < len(comments) and not comments[index].startswith(COMMAND_PREFIX):
        # editor modelines before the command
        index += 1
    while index < len(comments) and comments[index].startswith(COMMAND_PREFIX):
        commands.append(comments[index][2:].strip())
        index += 1
    paragraph: List[str] = []
    for line in comments[index:]:
        body = line[1:]
        # a blank comment or an indented example ends it
        if not body.strip() or body.startswith("  "):
            if paragraph:
                break
            continue
        paragraph.append(body.strip())
    return tuple(commands), _first_sentence(" ".join(paragraph))


def _first_sentence(text: str) -> str:
    sentence = re.split(r"(?<=\.)\s+(?=[A-Z])", text, maxsplit=1)[0]
    # "...; on Slurm:" introduced the example we drop
    if sentence.endswith(":") and "; " in sentence:
        sentence = sentence.rsplit("; ", 1)[0] + "."
    return sentence


def templates(root: Path = TEMPLATES_DIR) -> List[Template]:
    """Every ``<algorithm>/<name>.yaml`` under ``root``, sorted by name."""
    found = []
    for path in sorted(root.glob("*/*.yaml")):
        name = path.relative_to(root).with_suffix("").as_posix()
        commands, description = parse_header(path.read_text())
        by_name = tuple(_spec_option(root, path).sub(f"--spec {name}", command) for command in commands)
        found.append(Template(name, path.parent.name, by_name, description))
    return found


def _spec_option(root: Path, path: Path) -> "re.Pattern[str]":
    """A command's ``--spec`` naming the template by its path in the checkout (``templates/sft/tiny.yaml``)."""
    return re.compile(rf"--spec {re.escape(root.name)}/{re.escape(path.relative_to(root).as_posix())}\b")


def render_table(rows: Sequence[Template]) -> str:
    """A plain text table: TEMPLATE, COMMAND, DESCRIPTION (the last column is left unpadded)."""
    lines = [("TEMPLATE", "COMMAND", "DESCRIPTION")]
    for row in rows:
        commands = row.commands or ("",)
        lines.append((row.name, commands[0], row.description))
        # more than one command: one line each
        lines += [("", command, "") for command in commands[1:]]
    widths = [max(len(line[column]) for line in lines) for column in (0, 1)]
    return "".join(
        f"{path:<{widths[0]}}  {command:<{widths[1]}}  {description}".rstrip() + "\n"
        for path, command, description in lines
    )


def copy(name: str, destination: str) -> Tuple[Path, List[str]]:
    """Writes template ``name`` to ``destination`` (a file, or a folder to hold ``<name>.yaml``), naming the shipped
    files it uses where they are installed (a chain's stage specs by their names); returns the copy's path and
    those files, as the copy names them. Raises ValueError with one line where there is no such template or the
    copy would replace a file."""
    source = template_file(name)
    if source is None:
        raise ValueError(f"no template {name!r}; posttrain templates ls names them: sft/tiny, dpo/tiny, ...")
    target = Path(destination)
    if target.is_dir():
        target = target / source.name
    if target.exists():
        raise ValueError(f"{target} exists; name another file, or remove it first")
    if not target.parent.is_dir():
        raise ValueError(f"{target}: no folder {target.parent}; make it first")
    text = source.read_text()
    named = []
    for written, there in _shipped_files(source, yaml.safe_load(text)):
        # as a whole value (or a comment's mention of it), never inside a longer path
        text = re.sub(rf"(?<![\w./-]){re.escape(written)}(?![\w./-])", lambda _: there, text)
        named.append(there)
    text = _spec_option(TEMPLATES_DIR, source).sub(lambda _: f"--spec {target}", text)
    text = re.sub(r"\$schema=(\S+)", lambda m: f"$schema={(source.parent / m[1]).resolve()}", text, count=1)
    target.write_text(text)
    return target, list(dict.fromkeys(named))


def _shipped_files(source: Path, raw: Any) -> Iterator[Tuple[str, str]]:
    """Each path the template writes to a shipped file, and how the copy names that file: its data
    (``templates/data/...``: ``installed``) and a chain's stage specs (relative to the chain's file: by name)."""
    if isinstance(raw, dict):
        for key, value in raw.items():
            # a chain's stage
            if key == "spec" and isinstance(value, str):
                stage = Path(stage_file(source.parent, value)).resolve()
                shipped = stage.parent.parent == TEMPLATES_DIR
                yield value, stage.relative_to(TEMPLATES_DIR).with_suffix("").as_posix() if shipped else str(stage)
            else:
                yield from _shipped_files(source, value)
    elif isinstance(raw, list):
        for value in raw:
            yield from _shipped_files(source, value)
    elif shipped_file(raw) is not None:
        yield raw, installed(raw)


SUMMARY = "List the shipped templates, or copy one to edit."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``posttrain templates``' arguments on ``parser``."""
    commands = parser.add_subparsers(dest="templates_command", metavar="{ls,cp}")
    commands.add_parser("ls", help="list the templates (the default)", description="List the shipped templates.")
    cp = commands.add_parser(
        "cp",
        help="copy a template to edit, naming the shipped files it uses where installed",
        description="Copy a shipped template to edit; the copy names the shipped files it uses where installed.",
    )
    cp.add_argument("name", help="a template's name, as the list shows it: sft/tiny")
    cp.add_argument("destination", help="the copy's file, or a folder to hold it")


def run(args: argparse.Namespace) -> int:
    """Lists the templates, or copies one (``posttrain templates cp``); the exit code."""
    if args.templates_command != "cp":
        sys.stdout.write(render_table(templates()))
        return 0
    try:
        target, named = copy(args.name, args.destination)
    except ValueError as error:
        print(f"posttrain templates cp: {error}", file=sys.stderr)
        return 2
    print(f"copied {args.name} to {target}")
    if named:
        print("it uses these shipped files of posttrain's; name your own in their place to change them:")
        print("".join(f"  {path}\n" for path in named), end="")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m posttrain.components.tools.templates``: the same as ``posttrain templates``."""
    parser = argparse.ArgumentParser(prog="posttrain templates", description=SUMMARY)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
