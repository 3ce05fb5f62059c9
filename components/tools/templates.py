"""The shipped templates: what each one trains, and the command that runs it.

::

    python -m posttrain.components.tools.templates

prints one row per ``templates/<algorithm>/<name>.yaml``: its path, its
command (the ``# torchx run ...`` line it opens with) and its summary (the
first sentence of the comment after the command).

The templates are not installed as package data: they are found relative to
the checkout, ``Path(__file__).parents[2] / "templates"`` (the repository
root, as in an editable install), and their commands run from there.
"""

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence, Tuple

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates"

COMMAND_PREFIX = "# torchx run"


@dataclass(frozen=True)
class Template:
    """One template: its path relative to the repository root, its commands and its summary."""

    path: str
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
    """Every ``<algorithm>/<name>.yaml`` under ``root``, sorted by path."""
    found = []
    for path in sorted(root.glob("*/*.yaml")):
        commands, description = parse_header(path.read_text())
        relative = f"{root.name}/{path.relative_to(root).as_posix()}"
        found.append(Template(relative, path.parent.name, commands, description))
    return found


def render_table(rows: Sequence[Template]) -> str:
    """A plain text table: TEMPLATE, COMMAND, DESCRIPTION (the last column is left unpadded)."""
    lines = [("TEMPLATE", "COMMAND", "DESCRIPTION")]
    for row in rows:
        commands = row.commands or ("",)
        lines.append((row.path, commands[0], row.description))
        # more than one command: one line each
        lines += [("", command, "") for command in commands[1:]]
    widths = [max(len(line[column]) for line in lines) for column in (0, 1)]
    return "".join(
        f"{path:<{widths[0]}}  {command:<{widths[1]}}  {description}".rstrip() + "\n"
        for path, command, description in lines
    )


def main() -> int:
    if not TEMPLATES_DIR.is_dir():
        print(
            f"no templates at {TEMPLATES_DIR}: they ship with the repository, not the package; "
            "run this from a checkout (pip install -e .)",
            file=sys.stderr,
        )
        return 1
    sys.stdout.write(render_table(templates()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
