"""The job of ``posttrain.chain``: each stage in turn, with torchrun on the same nodes, in one allocation.

Every node runs this with the chain's spec and the launcher's arguments. For
each stage it runs ``posttrain.entrypoints.launcher`` (torchrun) with the
stage's own spec and rendezvous (the job's id and the stage's name; on
several nodes the rendezvous port plus the stage's index, so that no node
joins a stage's rendezvous while the one before still holds the port), and
waits for it; a stage that fails ends the chain with its exit code, its
launcher's one line the job's last (the chain's own lines, ``chain: stage
<name> ... starts``, say which stage it was).

Node 0 records each finished stage, with the spec it finished under, in
``<output_dir>/chain.json``. The same command again (after a kill, a
preemption, a requeue) skips the finished stages and runs the rest; the stage
it was in resumes from its newest checkpoint as any run does (``resume:
auto``). A finished stage whose spec has changed since stops the chain with
one line. At the end node 0 writes the chain's ``run_summary.json`` (each
stage's status, time and first and last metrics) and ``curves.png`` (a
panel of each stage's curves), and its last line names every stage's model.
"""

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from posttrain.components.spec.chain import Chain, Stage, chain_from_json
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints import curves, rendezvous_port
from posttrain.entrypoints.checkpoints import write_json_atomic
from posttrain.entrypoints.error_file import STOPPED, record_error

STATE_FILE = "chain.json"
SUMMARY_FILE = "run_summary.json"


def stage_command(stage: Stage, index: int, launcher_args: Sequence[str]) -> List[str]:
    """The launcher's command line for ``stage``: the chain's arguments with the stage's rendezvous."""
    args = list(launcher_args)
    args[args.index("--rdzv_id") + 1] += f"-{stage.name}"
    endpoint = args.index("--rdzv_endpoint") + 1
    host, port = args[endpoint].rsplit(":", 1)
    if port != "0":  # several nodes: a port of the stage's own
        args[endpoint] = f"{host}:{int(port) + index}"
    spec_json = stage.spec.to_json()
    return [
        sys.executable,
        "-m",
        "posttrain.entrypoints.launcher",
        *args,
        "-m",
        module(stage),
        "--spec-json",
        spec_json,
    ]


def module(stage: Stage) -> str:
    return f"posttrain.entrypoints.{stage.spec.name()}"


def changed_keys(finished: Dict[str, Any], now: Dict[str, Any], prefix: str = "") -> List[str]:
    """The key paths whose values differ between two specs as plain data.

    >>> changed_keys({"training": {"max_steps": 40, "seed": 0}}, {"training": {"max_steps": 20, "seed": 0}})
    ['training.max_steps']
    """
    keys = []
    for key in sorted(set(finished) | set(now)):
        old, new = finished.get(key), now.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            keys += changed_keys(old, new, f"{prefix}{key}.")
        elif old != new:
            keys.append(f"{prefix}{key}")
    return keys


def finished_stages(chain: Chain) -> Dict[str, Dict[str, Any]]:
    """The stages ``chain.json`` records as finished; stops the chain where one finished under another spec."""
    path = Path(chain.output_dir) / STATE_FILE
    state = json.loads(path.read_text()) if path.exists() else {"stages": {}}
    finished = state["stages"]
    for stage in chain.stages:
        record = finished.get(stage.name)
        if record is None:
            continue
        changed = changed_keys(record["spec"], json.loads(stage.spec.to_json()))
        if changed:
            raise SpecError(
                [
                    f"stages.{stage.name}: finished in {stage.output_dir} under another spec ({', '.join(changed[:3])} "
                    f"changed since); delete {stage.output_dir} to train it again, or give the chain another "
                    "output_dir"
                ]
            )
    return finished


def run_stage(command: List[str]) -> int:
    """Runs a stage's launcher to its end. SIGTERM or SIGINT (a preemption, a cancel) is passed on once, so the
    stage checkpoints: the launcher has a session of its own, where a signal to the chain's group does not
    reach it a second time, mid-save."""
    process = subprocess.Popen(command, start_new_session=True)

    def pass_on(signum: int, frame: Any) -> None:
        process.send_signal(signum)

    previous = {signum: signal.signal(signum, pass_on) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        return process.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def summary(chain: Chain, finished: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    stages = []
    for stage in chain.stages:
        path = Path(stage.output_dir) / SUMMARY_FILE
        run = json.loads(path.read_text()) if path.exists() else {}
        stages.append(
            {
                "name": stage.name,
                "algorithm": stage.spec.name(),
                "status": "finished" if stage.name in finished else "not run",
                "seconds": finished.get(stage.name, {}).get("seconds"),
                "output_dir": stage.output_dir,
                "global_steps": run.get("global_steps"),
                "metrics_first": run.get("metrics_first", {}),
                "metrics_last": run.get("metrics_last", {}),
            }
        )
    return {"algorithm": "chain", "output_dir": chain.output_dir, "stages": stages}


def closing_line(chain: Chain, seconds: float) -> str:
    """The chain's last line: its stages and where each one's model is.

    >>> closing_line(chain_from_json(EXAMPLE), 61.2)
    'posttrain: chain finished 2 stages in 61 s: sft -> out/sft, dpo -> out/dpo'
    """
    outputs = ", ".join(f"{stage.name} -> {stage.output_dir}" for stage in chain.stages)
    return f"posttrain: chain finished {len(chain.stages)} stages in {seconds:.0f} s: {outputs}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posttrain.entrypoints.chain")
    parser.add_argument("--spec-json", required=True)
    parser.add_argument("--node", required=True, help="this node's rank (torchx's replica id)")
    parser.add_argument("--rank0-host", required=True)
    parser.add_argument("launcher_args", nargs=argparse.REMAINDER, help="after --: torchrun's arguments")
    args = parser.parse_args(argv)
    launcher_args = args.launcher_args[1:] if args.launcher_args[:1] == ["--"] else args.launcher_args
    started = time.monotonic()
    try:
        chain = chain_from_json(args.spec_json)
        finished = finished_stages(chain)
    except SpecError as error:
        line = f"posttrain: {error}"
        print(line, file=sys.stderr, flush=True)
        record_error(line)
        return STOPPED
    output_dir = Path(chain.output_dir)
    app_id = launcher_args[launcher_args.index("--rdzv_id") + 1]
    for index, stage in enumerate(chain.stages):
        if stage.name in finished:
            print(f"chain: stage {stage.name} finished already ({stage.output_dir})", file=sys.stderr, flush=True)
            continue
        command = stage_command(stage, index, launcher_args)
        port = command[command.index("--rdzv_endpoint") + 1].rsplit(":", 1)[1]
        if port != "0" and rendezvous_port.main([port, args.node, args.rank0_host, app_id]) != 0:
            return STOPPED
        print(f"chain: stage {stage.name} ({stage.spec.name()}) starts", file=sys.stderr, flush=True)
        stage_started = time.monotonic()
        code = run_stage(command)
        if code != 0:  # the stage's launcher said why, in one line: the job's last
            return code
        if args.node == "0":
            seconds = time.monotonic() - stage_started
            finished[stage.name] = {"spec": json.loads(stage.spec.to_json()), "seconds": seconds}
            write_json_atomic(output_dir / STATE_FILE, {"stages": finished})
    if args.node == "0":
        write_json_atomic(output_dir / SUMMARY_FILE, summary(chain, finished))
        panels = [
            (stage.name, curves.series(curves.read_metrics(Path(stage.output_dir) / curves.METRICS_FILE)))
            for stage in chain.stages
        ]
        curves.draw(
            panels, f"chain · {' -> '.join(stage.name for stage in chain.stages)}", output_dir / curves.CURVES_FILE
        )
        print(closing_line(chain, time.monotonic() - started), file=sys.stderr, flush=True)
    return 0


EXAMPLE = json.dumps(
    {
        "algorithm": "chain",
        "output_dir": "out",
        "stages": {
            "sft": {
                "algorithm": "sft",
                "model": {"name_or_path": "builtin:tiny-llama"},
                "data": {"train": {"path": "rows.jsonl"}},
                "training": {},
            },
            "dpo": {
                "algorithm": "dpo",
                "model": {"name_or_path": "${stages.sft.output}"},
                "data": {"train": {"path": "pairs.jsonl"}},
                "training": {},
            },
        },
    }
)

if __name__ == "__main__":
    sys.exit(main())
