"""The ``posttrain`` command: what users type besides ``torchx run`` (the ``tune ls`` / ``trl sft`` habit).

::

    posttrain templates ls                        # the shipped templates, what each does, its command
    posttrain templates cp sft/tiny my-sft.yaml   # a template of your own to edit
    posttrain plot outputs/sft-tiny               # a run's curves (several runs: side by side)

Training runs through torchx (``torchx run -s local_cwd posttrain.sft --spec sft/tiny``), which schedules it.
"""

import argparse
import sys
from typing import Optional, Sequence

from posttrain.components.tools import plot, templates

COMMANDS = {"templates": templates, "plot": plot}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="posttrain",
        description="What posttrain's users type besides torchx run: its templates, its curves.",
        epilog="Training: torchx run -s local_cwd posttrain.sft --spec sft/tiny (torchx builtins lists posttrain.*)",
    )
    commands = parser.add_subparsers(dest="command", metavar="{templates,plot}", required=True)
    for name, module in COMMANDS.items():
        module.add_arguments(commands.add_parser(name, help=module.SUMMARY, description=module.SUMMARY))
    args = parser.parse_args(argv)
    return COMMANDS[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
