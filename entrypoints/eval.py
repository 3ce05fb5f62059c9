"""posttrain.eval's job: one evaluation (entrypoints/evaluation/run.py) on the job's processes, its closing line
said, and the job failed where a ``require:`` condition does not hold.

What it reads, writes and refuses: docs/pages/eval.md; the spec: components/spec/evaluation.py.
"""

import argparse
from datetime import timedelta
from pathlib import Path
from typing import Optional, Sequence

from posttrain.components.spec.evaluation import eval_from_json
from posttrain.entrypoints.evaluation.parts import parts
from posttrain.entrypoints.evaluation.run import check_required, evaluate
from posttrain.entrypoints.process import distributed
from posttrain.entrypoints.process.ending import ends_in_one_line, quiet_libraries
from posttrain.entrypoints.process.error_file import report_done
from posttrain.entrypoints.records.summary import say_closing

# the processes wait for each other this long at most (rank 0 summarising, a slow model's prompts)
TIMEOUT = timedelta(hours=2)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m posttrain.entrypoints.eval")
    parser.add_argument("--spec-json", required=True, help="the validated spec, as the component embedded it")
    options = parser.parse_args(argv)
    distributed.setup_logging()
    distributed.end_with_the_launchers_parent()
    quiet_libraries()
    with ends_in_one_line() as ending:
        spec = eval_from_json(options.spec_json)
        ending.logs = Path(spec.output_dir) / "logs"
        distributed.init_process_group(distributed.group_backend(), TIMEOUT)
        evaluated = evaluate(parts(spec))
        if evaluated is not None:
            say_closing(evaluated.line)
        check_required(evaluated)
    report_done()


if __name__ == "__main__":
    distributed.exit_after(main)
