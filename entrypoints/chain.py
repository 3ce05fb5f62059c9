"""The job of ``posttrain.chain``: each stage in turn, with torchrun on the same nodes, in one allocation.

Every node runs this with the chain's spec and the launcher's arguments. For
each stage it runs ``posttrain.entrypoints.launcher`` (torchrun) with the
stage's own spec and rendezvous (the job's id and the stage's name; with c10d
on several nodes also the rendezvous port plus the stage's index, so that no
node joins a stage's rendezvous while the one before still holds the port),
and waits for it. A stage that fails ends the chain with its exit code, its
launcher's one line the job's last; the chain's own lines (``chain: stage
<name> ... starts``) say which stage it was, and a stage's closing line is
one of them (``chain: stage <name>: ...``), so that the job ends with one
``posttrain:`` line, failed or finished.

Node 0 holds the chain's ``output_dir`` by a lease while the chain runs
(``process/lease.py``, as a run holds its own): a second chain into it stops in
one line before any stage starts. Node 0 records each finished stage, with the
spec it finished under, in ``<output_dir>/chain.json``. The same command again
(after a kill, a preemption, a requeue) skips the stages recorded there whose
model is still in their directory, and runs the rest: the stage it was in
resumes from its newest checkpoint as any run does (``resume: auto``), and
every stage after a stage that runs runs again (its input is new). A finished
stage whose spec has changed since stops the chain with one line; one whose
input changed since, by content (a model it was trained from, trained again or
edited in place; a local data file edited: its run records each one's
fingerprint, ``records/fingerprints.py``), runs again, its run from the old
inputs removed. An evaluation stage (a gate) runs every time: its job samples
again only what changed and judges its conditions again; a stage after it does
not run again for it. SIGTERM or SIGINT (a preemption), or the end of the
process that started the chain, is passed on to the running stage once, so
that it checkpoints, and no stage starts after it. At the end, and at a
failure, node 0 writes the chain's
``run_summary.json`` (each stage's status, time and first and last metrics)
and, at the end, ``curves.png`` (each stage's curves) and the closing line,
which names every stage's model.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from posttrain.components.spec.chain import STAGE_ENV, Chain, Stage, chain_from_json
from posttrain.components.spec.evaluation import EvalSpec
from posttrain.components.spec.loading import spec_diff, training_relevant
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints import rendezvous_port
from posttrain.entrypoints.evaluation import files as evaluation_files
from posttrain.entrypoints.process import distributed, lease
from posttrain.entrypoints.process.error_file import STOPPED, record_error
from posttrain.entrypoints.records import curves
from posttrain.entrypoints.records.checkpoints import read_record, stale_runs
from posttrain.entrypoints.records.files import write_json_atomic

STATE_FILE = "chain.json"
SUMMARY_FILE = "run_summary.json"
# their endpoint is the job's own store; etcd's is a server of its own
SHIFTED_BACKENDS = ("c10d", "static")


def stage_command(stage: Stage, index: int, launcher_args: Sequence[str]) -> List[str]:
    """The launcher's command line for ``stage``: the chain's arguments with the stage's rendezvous."""
    args = list(launcher_args)
    args[args.index("--rdzv_id") + 1] += f"-{stage.name}"
    endpoint = args.index("--rdzv_endpoint") + 1
    host, port = args[endpoint].rsplit(":", 1)
    # several nodes: its own port
    if port != "0" and args[args.index("--rdzv_backend") + 1] in SHIFTED_BACKENDS:
        args[endpoint] = f"{host}:{int(port) + index}"
    spec_json = stage.spec.to_json()
    module = f"posttrain.entrypoints.{stage.spec.name()}"
    return [sys.executable, "-m", "posttrain.entrypoints.launcher", *args, "-m", module, "--spec-json", spec_json]


def finished_stages(chain: Chain) -> Dict[str, Dict[str, Any]]:
    """The training stages to skip: recorded in ``chain.json`` as finished, their model still in their directory,
    and no training stage before them to run again (an evaluation stage, or a training stage with an
    ``evaluate:`` section, runs every time, and is never a reason for the stages after it to). Stops the chain
    where one finished under another spec."""
    path = Path(chain.output_dir) / STATE_FILE
    remedy = "remove it (the chain then runs every stage again) or use another output_dir"
    recorded = read_record(path, remedy, keys=("stages",))["stages"] if path.exists() else {}
    finished: Dict[str, Dict[str, Any]] = {}
    for stage in chain.stages:
        if isinstance(stage.spec, EvalSpec):
            # a gate judges its models every time (its job samples again only what changed); no stage after it
            # runs again for it
            continue
        record = recorded.get(stage.name)
        if record is None or not (Path(stage.output_dir) / SUMMARY_FILE).exists():
            # this stage runs, and so every stage after it
            break
        if _stale(stage)[0]:
            # a model it was trained from, or its data, changed since (outside the chain): it runs again
            break
        changed = [d[0] for d in spec_diff(record["spec"], stage.spec.model_dump(mode="json"))]
        changed = [key for key in changed if training_relevant(key)]
        if changed:
            raise SpecError(
                [
                    f"stages.{stage.name}: finished in {stage.output_dir} under another spec ({', '.join(changed[:3])} "
                    f"changed since); delete {stage.output_dir} to train it (and the stages after it) again, or give "
                    "the chain another output_dir"
                ]
            )
        if stage.spec.evaluate is not None:
            # its job evaluates every time, as an evaluation stage does (training nothing: it is finished)
            continue
        finished[stage.name] = record
    return finished


def _stale(stage: Stage) -> Tuple[List[str], List[Path]]:
    """What changed in a training stage's inputs since its run recorded them, and the records that say so
    (``checkpoints.stale_runs``)."""
    spec = stage.spec
    return stale_runs(spec.named_models(), spec.model.revision, spec.data, Path(stage.output_dir))


def clear_stale(stage: Stage) -> None:
    """Removes what a stage trained from a model or on data that has changed since (its finished run's summary,
    its checkpoints), saying what changed: its run would otherwise be finished, or resumed, on the old ones."""
    if isinstance(stage.spec, EvalSpec):
        # its job replaces results of other models itself
        return
    changes, stale = _stale(stage)
    if not changes:
        return
    print(
        f"chain: stage {stage.name}: {'; '.join(changes)}; training it again (its run from the old inputs removed)",
        file=sys.stderr,
        flush=True,
    )
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


class Stopping:
    """SIGTERM, SIGINT, or the end of the process that started the chain: passed on once to the running stage,
    after which no stage starts."""

    def __init__(self) -> None:
        self.signal: Optional[int] = None
        self.stage: Optional[subprocess.Popen] = None
        self._previous: Dict[int, Any] = {}
        self._done = threading.Event()

    def __enter__(self) -> "Stopping":
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, lambda signum, frame: self.stop(signum))
        parent = os.getppid()
        # on local_cwd, the torchx client: killed, its job ends (as distributed.py's ranks do)
        if parent > 1:
            threading.Thread(target=self._watch, args=(parent,), daemon=True).start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._done.set()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def stop(self, signum: int) -> None:
        if self.signal is not None:
            # a second SIGTERM would end torchrun's own wait for the ranks' checkpoint
            return
        self.signal = signum
        if self.stage is not None and self.stage.poll() is None:
            self.stage.send_signal(signum)

    def run(self, command: List[str], env: Dict[str, str]) -> int:
        """Runs a stage's launcher to its end, in a session of its own (a signal to the chain's process group
        reaches it through ``stop``, once); its exit code, 128 + the signal where a signal ended it."""
        self.stage = subprocess.Popen(command, env=env, start_new_session=True)
        # came while it started
        if self.signal is not None:
            self.stage.send_signal(self.signal)
        code = self.stage.wait()
        return 128 - code if code < 0 else code

    def _watch(self, parent: int) -> None:
        while os.getppid() == parent:
            if self._done.wait(1.0):
                return
        print(f"chain: the process that started this job (pid {parent}) is gone: stopping", file=sys.stderr)
        self.stop(signal.SIGTERM)


def summary(chain: Chain, finished: Dict[str, Dict[str, Any]], failed: Optional[str] = None) -> Dict[str, Any]:
    stages = []
    for stage in chain.stages:
        status = "finished" if stage.name in finished else "failed" if stage.name == failed else "not run"
        entry = {
            "name": stage.name,
            "algorithm": stage.spec.name(),
            "status": status,
            "seconds": finished.get(stage.name, {}).get("seconds"),
            "output_dir": stage.output_dir,
        }
        if isinstance(stage.spec, EvalSpec):
            # a gate's conditions, held or not (written before they are judged)
            path = Path(stage.output_dir) / evaluation_files.SUMMARY_FILE
            evaluated = json.loads(path.read_text()) if status != "not run" and path.is_file() else {}
            entry.update(closing_line=evaluated.get("closing_line"), require=evaluated.get("require", []))
        else:
            path = Path(stage.output_dir) / SUMMARY_FILE
            run = json.loads(path.read_text()) if stage.name in finished else {}
            entry.update(
                global_steps=run.get("global_steps"),
                metrics_first=run.get("metrics_first", {}),
                metrics_last=run.get("metrics_last", {}),
            )
        stages.append(entry)
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
    with Stopping() as stopping:
        return _run(args.spec_json, args.node, args.rank0_host, launcher_args, stopping)


def _run(spec_json: str, node: str, rank0_host: str, launcher_args: List[str], stopping: Stopping) -> int:
    node0 = node == "0"
    try:
        chain = chain_from_json(spec_json)
        # node 0 writes chain.json and the summary: one chain per directory, as one run per output_dir
        held = lease.acquire(Path(chain.output_dir), key="output_dir") if node0 else None
    except SpecError as error:
        return _stopped(error, node0)
    try:
        return _run_stages(chain, node, rank0_host, launcher_args, stopping)
    finally:
        if held is not None:
            held.release()


def _stopped(error: SpecError, node0: bool) -> int:
    line = f"posttrain: {error}"
    # every node meets it; one says it
    if node0:
        print(line, file=sys.stderr, flush=True)
    record_error(line)
    return STOPPED


def _run_stages(chain: Chain, node: str, rank0_host: str, launcher_args: List[str], stopping: Stopping) -> int:
    node0, started = node == "0", time.monotonic()
    try:
        finished = finished_stages(chain)
    except SpecError as error:
        return _stopped(error, node0)
    output_dir = Path(chain.output_dir)
    app_id = launcher_args[launcher_args.index("--rdzv_id") + 1]
    for index, stage in enumerate(chain.stages):
        if stage.name in finished:
            if node0:
                print(f"chain: stage {stage.name} finished already ({stage.output_dir})", file=sys.stderr, flush=True)
            continue
        command = stage_command(stage, index, launcher_args)
        port = command[command.index("--rdzv_endpoint") + 1].rsplit(":", 1)[1]
        if port != "0" and rendezvous_port.main([port, node, rank0_host, app_id]) != 0:
            return STOPPED
        if stopping.signal is not None:
            return 128 + stopping.signal
        if node0:
            # before its launcher joins the rendezvous: no node's stage reads it first
            clear_stale(stage)
            print(f"chain: stage {stage.name} ({stage.spec.name()}) starts", file=sys.stderr, flush=True)
        stage_started = time.monotonic()
        code = stopping.run(command, dict(os.environ, **{STAGE_ENV: stage.name}))
        if code != 0:
            if node0:
                write_json_atomic(output_dir / SUMMARY_FILE, summary(chain, finished, failed=stage.name))
            return code
        if node0:
            record = {"spec": stage.spec.model_dump(mode="json"), "seconds": time.monotonic() - stage_started}
            finished[stage.name] = record
            write_json_atomic(output_dir / STATE_FILE, {"stages": finished})
        else:
            finished[stage.name] = {}
    if node0:
        write_json_atomic(output_dir / SUMMARY_FILE, summary(chain, finished))
        runs = [
            (s.name, curves.series(curves.read_metrics(Path(s.output_dir) / curves.METRICS_FILE)))
            for s in chain.stages
            if not isinstance(s.spec, EvalSpec)
        ]
        curves.draw(
            runs, f"chain · {' -> '.join(stage.name for stage in chain.stages)}", output_dir / curves.CURVES_FILE
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
                "training": {"output_dir": "out/sft"},
            },
            "dpo": {
                "algorithm": "dpo",
                "model": {"name_or_path": "out/sft"},
                "data": {"train": {"path": "pairs.jsonl"}},
                "training": {"output_dir": "out/dpo"},
            },
        },
    }
)

if __name__ == "__main__":
    distributed.exit_after(main)
