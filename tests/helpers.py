"""Test helpers: running the real ``torchx`` CLI and reading what a run wrote."""

import dataclasses
import functools
import importlib
import json
import logging
import os
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import pytest
import yaml

from posttrain.entrypoints.records import curves

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "templates"
# the console script README's install puts beside the interpreter
POSTTRAIN = str(Path(sys.executable).with_name("posttrain"))


def job_env(tmp_root: Path, **extra: str) -> Dict[str, str]:
    """The environment of a CLI run: this interpreter's ``python`` first on PATH, caches in a temp dir."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HF_HOME"] = str(tmp_root / "hf_home")
    env["HF_HUB_OFFLINE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    # torchx's CLI sets its own
    env.pop("TORCHX_CONTEXT_NAME", None)
    env.update(extra)
    return env


def two_gloo_ranks(code: str, **env: str) -> List[subprocess.Popen]:
    """Ranks 0 and 1 of a two-process group on this host (a free ``MASTER_PORT``), each running ``python -c code``
    with ``env`` added; their output (stderr in stdout) is theirs to read."""
    group = {**os.environ, **env, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    return [
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**group, "RANK": str(rank)},
        )
        for rank in (0, 1)
    ]


def free_port(span: int = 1) -> int:
    """A port free now, with the ``span - 1`` after it (a chain's stage i rendezvouses on the port plus i, minutes
    later), below the kernel's ephemeral range: a port there may go to any outgoing connection meanwhile, and a
    listener cannot bind it then (a Slurm chain's third stage once found its port so taken)."""
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    while True:
        base = _PORTS.randrange(10000, ephemeral - span)
        if all(_bindable(base + offset) for offset in range(span)):
            return base


# not the random module's: a test's seed would give every test the same ports
_PORTS = random.SystemRandom()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("localhost", port))
        except OSError:
            return False
        return True


# the most stages a chain template has, and one more
CHAIN_PORTS = 4


def torchx(args: Sequence[str], tmp_root: Path, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """Runs ``torchx ARGS`` from the repository root (local_cwd's working directory)."""
    command = [str(Path(sys.executable).parent / "torchx"), *args]
    return subprocess.run(
        command, cwd=REPO, env=job_env(tmp_root, **env), capture_output=True, text=True, timeout=timeout
    )


def start_training(
    args: Sequence[str], tmp_root: Path, log_path: Path, steps: int, within: float = 120
) -> subprocess.Popen:
    """Starts ``torchx ARGS`` in a session of its own, its output in ``log_path``; returns once rank 0 has logged
    ``steps`` steps (or ``within`` seconds passed)."""
    with log_path.open("w") as log:
        client = subprocess.Popen(
            [str(Path(sys.executable).parent / "torchx"), *args],
            cwd=REPO,
            env=job_env(tmp_root),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.time() + within
    while log_path.read_text().count("posttrain[0] INFO step ") < steps and time.time() < deadline:
        time.sleep(0.5)
    return client


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def log_history(output_dir: Path) -> List[Dict[str, Any]]:
    """The training log entries of ``trainer_state.json`` (the closing summary left out)."""
    history = read_json(output_dir / "trainer_state.json")["log_history"]
    return [entry for entry in history if "train_samples_per_second" not in entry]


def series(output_dir: Path, key: str) -> List[float]:
    return [entry[key] for entry in log_history(output_dir) if key in entry]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def load_template(relative: str) -> Dict[str, Any]:
    return yaml.safe_load((TEMPLATES / relative).read_text())


def run_template(
    template: str,
    tmp_root: Path,
    output_dir: Path,
    j: str = "1x2",
    overrides: Sequence[str] = (),
    extra_args: Sequence[str] = (),
    timeout: float = 600,
    **env: str,
) -> subprocess.CompletedProcess:
    """``torchx run -s local_cwd posttrain.<algorithm> --spec templates/<template> -j J`` into output_dir."""
    algorithm = load_template(template)["algorithm"]
    args = [
        "run",
        "-s",
        "local_cwd",
        f"posttrain.{algorithm}",
        "--spec",
        f"templates/{template}",
        "-j",
        j,
        "--rdzv_port",
        str(free_port()),
        *extra_args,
        f"training.output_dir={output_dir}",
        *overrides,
    ]
    return torchx(args, tmp_root, timeout=timeout, **env)


def assert_succeeded(result: subprocess.CompletedProcess) -> None:
    """Exit 0, else fail showing the errors the job printed and the end of its output."""
    if result.returncode == 0:
        return
    errors = [line for line in result.stderr.splitlines() if "Error" in line or "Traceback" in line][:40]
    raise AssertionError(
        f"exit {result.returncode}\n--- error lines\n"
        + "\n".join(errors)
        + f"\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-8000:]}"
    )


def assert_stopped_once(result: subprocess.CompletedProcess, message: str) -> str:
    """The run failed with one ``posttrain:`` line, ``message``, and no rank's traceback, and torchx's closing
    status carries that line as the app's structured error; its output."""
    logs = result.stdout + result.stderr
    job, _, status = logs.partition("AppStatus:")
    assert result.returncode != 0
    assert job.count("posttrain: ") == 1 and f"posttrain: {message}" in job, job[-4000:]
    assert not status or "structured_error_msg:" in status and "posttrain: " in status, status
    # no rank's traceback ("[1]:Traceback"), no torchrun report (its ChildFailedError block): the line is the job's last
    assert not re.search(r"\[\d+\]:(\[rank\d+\]: )?Traceback", logs) and "ChildFailedError" not in logs, logs[-4000:]
    job_lines = [line for line in job.splitlines() if line and not line.startswith("torchx ")]
    assert job_lines and "posttrain: " in job_lines[-1], logs[-4000:]
    return logs


def ends(output_dir: Path, key: str) -> tuple:
    """Mean of the first and the last three logged values of a metric, checked against run_summary.json."""
    import pytest

    values = series(output_dir, key)
    assert len(values) >= 6, f"{key}: first and last three logged values must not overlap"
    first, last = mean(values[:3]), mean(values[-3:])
    summary = read_json(output_dir / "run_summary.json")
    assert summary["metrics_first"][key] == pytest.approx(first)
    assert summary["metrics_last"][key] == pytest.approx(last)
    return first, last


def assert_calls_the_rooms_tool(output_dir: Path) -> None:
    """A run of templates/grpo/tiny-tools.yaml: at its end the model peeked in most rollouts, each room served its
    own row's value, and the reward read the answer after the call."""
    first, last = ends(output_dir, "tools/call_frequency")
    assert last > 0.5, (first, last)
    samples = [json.loads(line) for line in (output_dir / "samples.jsonl").read_text().splitlines()]
    called = [sample for sample in samples if any(message["role"] == "tool" for message in sample["completion"])]
    assert len(called) > len(samples) / 2, samples[:2]
    for sample in called:
        peeked = next(message["content"] for message in sample["completion"] if message["role"] == "tool")
        written = "".join(message.get("content") or "" for message in sample["completion"] if message["role"] != "tool")
        numbers = [number.replace(",", "") for number in re.findall(r"-?\d[\d,]*(?:\.\d+)?", written)]
        # exact_match scores 1 exactly where the last number the model wrote is the digit its own room served
        assert sample["rewards"]["exact_match"] == float(numbers[-1:] == [peeked]), sample


def sft_spec(tmp_path: Path, **changes: Any) -> Any:
    """The tiny SFT template validated, writing under ``tmp_path``, with top-level sections replaced by ``changes``."""
    from posttrain.components.spec.loading import validate

    raw = load_template("sft/tiny.yaml")
    raw["training"]["output_dir"] = str(tmp_path / "out")
    raw.update(changes)
    return validate(raw)


def resume_of(spec: Any, output_dir: Path) -> Any:
    """What the job decides resume from for ``spec``, writing into ``output_dir``."""
    from posttrain.entrypoints.job import spec_parts

    return dataclasses.replace(spec_parts.parts(spec).resume, output_dir=output_dir)


def fingerprints_of(spec: Any) -> Any:
    """The fingerprint of each model ``spec`` names, as a run records what it was trained from."""
    from posttrain.entrypoints.records.fingerprints import model_fingerprints

    return model_fingerprints(spec.named_models(), spec.model.revision)


def tiny_job(tmp_path: Path, algorithm: str, **changes: Any) -> Any:
    """The job ``run`` would build from the algorithm's tiny template, every extra model the template's built-in one."""
    from posttrain.components.spec.loading import validate
    from posttrain.components.spec.registry import SPEC_CLASSES
    from posttrain.entrypoints.inputs.data import load_data
    from posttrain.entrypoints.inputs.models import import_object, load_tokenizer
    from posttrain.entrypoints.job.config import training_arguments

    raw = load_template(f"{algorithm}/tiny.yaml")
    raw["training"]["output_dir"] = str(tmp_path / "out")
    raw.update({field: raw["model"]["name_or_path"] for field in SPEC_CLASSES[algorithm].extra_models})
    raw.update(changes)
    spec = validate(raw)
    args = import_object(spec.config_class)(**training_arguments(spec, dict(spec.training)))
    tokenizer = load_tokenizer(spec.model.name_or_path, spec.model, "left" if spec.generates else "right")
    data = load_data(spec.data.train, spec.data.columns, "data.train", spec.data_formats)
    return job_of(spec, args, tokenizer, data)


@functools.cache
def _spec_job() -> Any:
    from posttrain.entrypoints.job import runtime

    @dataclasses.dataclass
    class SpecJob(runtime.Job):
        """A job with the spec it was split from, which the tests read (the job's steps do not)."""

        spec: Any = None

    return SpecJob


def job_of(spec: Any, args: Any, tokenizer: Any, train_dataset: Any) -> Any:
    """The job ``run`` builds for ``spec`` from its config, tokenizer and data, without evaluation data or callbacks;
    its spec kept beside it (``job.spec``) for the tests (``dataclasses.replace`` keeps it)."""
    from posttrain.entrypoints.inputs.rewards import resolve_rewards
    from posttrain.entrypoints.inputs.tools import resolve_environment, resolve_tools
    from posttrain.entrypoints.job import spec_parts

    split = spec_parts.parts(spec)
    return _spec_job()(
        split.models,
        split.fast_paths,
        args,
        tokenizer,
        train_dataset,
        None,
        callbacks=[],
        rewards=resolve_rewards(split.rewards),
        reward_weights=[reward.weight for reward in split.rewards],
        tools=resolve_tools(split.tools),
        environment_factory=resolve_environment(split.environment, scored=bool(split.rewards)),
        spec=spec,
    )


def build_trainer(job: Any) -> Any:
    """The trainer the algorithm's entrypoint builds from the job, as ``run`` has it built."""
    from posttrain.entrypoints.job import runtime

    entrypoint = importlib.import_module(f"posttrain.entrypoints.{job.spec.algorithm}")
    return runtime.built_trainer(job, entrypoint.build_trainer)


def run_entrypoint(algorithm: str, spec_json: str) -> None:
    """Runs the algorithm's entrypoint in this process, as ``python -m posttrain.entrypoints.<algorithm>``; the
    ``posttrain`` logger as it was after (run() gives it a handler on this moment's stderr, which a test's capture
    closes)."""
    from posttrain.entrypoints.job import runtime

    entrypoint = importlib.import_module(f"posttrain.entrypoints.{algorithm}")
    logger = logging.getLogger("posttrain")
    kept = list(logger.handlers), logger.propagate, logger.level
    try:
        runtime.run(algorithm, entrypoint.build_trainer, argv=["--spec-json", spec_json])
    finally:
        logger.handlers, logger.propagate = kept[0], kept[1]
        logger.setLevel(kept[2])


def stopped_in_process(algorithm: str, spec_json: str, capsys: pytest.CaptureFixture) -> str:
    """Runs the entrypoint in this process, expecting a stop (exit 2, one ``posttrain:`` line); what it printed."""
    with pytest.raises(SystemExit) as exit_info:
        run_entrypoint(algorithm, spec_json)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def run_refused(raw: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> str:
    """Runs the spec ``raw`` in this process, expecting a stop before any model loads; what it printed."""
    from posttrain.components.spec.loading import validate
    from posttrain.entrypoints.job import runtime

    with monkeypatch.context() as patch:
        patch.setattr(runtime, "load_model", lambda *args, **kwargs: pytest.fail("a model loaded"))
        return stopped_in_process(raw["algorithm"], validate(raw).to_json(), capsys)


def trainer_with(job: Any, train_dataset: Any = None, **training: Any) -> Any:
    """The trainer the job builds, with ``training`` set on its config beyond what the spec allows."""
    from posttrain.entrypoints.inputs.models import import_object
    from posttrain.entrypoints.job.config import training_arguments

    kwargs = {**training_arguments(job.spec, dict(job.spec.training)), **training}
    args = import_object(job.spec.config_class)(**kwargs)
    dataset = job.train_dataset if train_dataset is None else train_dataset
    return build_trainer(dataclasses.replace(job, args=args, train_dataset=dataset))


def refusal(job: Any, **training: Any) -> str:
    """What the spec says of the job's spec with ``training`` added."""
    from posttrain.components.spec.loading import SpecError, validate

    with pytest.raises(SpecError) as error:
        validate({**job.spec.model_dump(), "training": {**job.spec.training, **training}})
    return str(error.value)


# ---------------------------------------------------------------- what conftest's fixtures set

# the lease's heartbeat, and the silence after which its holder is gone, in the tests (the job's: 5 s and 60 s)
HEARTBEAT_S, STALE_S = 0.2, 1.5
# the job's token for its vllm role, as the component makes one
JOB_TOKEN = "the-job-s-secret"


# ---------------------------------------------------------------- data files: the shipped chat rows, reshaped

CHAT = REPO / "templates/data/sft_chat.jsonl"


def _write(path: Path, rows: List[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _qa(tmp_path: Path) -> str:
    """The shipped chat rows as question/answer pairs: a source that needs its own renames."""
    rows = [json.loads(line)["messages"] for line in CHAT.read_text().splitlines()]
    return _write(tmp_path / "qa.jsonl", [{"question": m[0]["content"], "answer": m[1]["content"]} for m in rows])


def _pc(tmp_path: Path) -> str:
    """The shipped chat rows as prompt/completion pairs."""
    rows = [json.loads(line)["messages"] for line in CHAT.read_text().splitlines()]
    return _write(tmp_path / "pc.jsonl", [{"prompt": m[0]["content"], "completion": m[1]["content"]} for m in rows])


# ---------------------------------------------------------------- Mistral's own tokenizer files

# (the file mistral_common ships, the name a model directory gives it, the tokenizer's vocabulary)
MISTRAL_FORMATS = {
    "tekken": ("tekken_240911.json", "tekken.json", 131072),
    "sentencepiece": ("mistral_instruct_tokenizer_240323.model.v3", "tokenizer.model", 32768),
}


def run_tiny_sft(tmp_path: Path, model: Path, data: str) -> Path:
    """The tiny SFT, in this process as rank 0 (the ``job_process`` fixture), on ``model`` and the rows of
    ``data``, for 12 steps."""
    from posttrain.components.spec.loading import validate

    raw = load_template("sft/tiny.yaml")
    raw["model"]["name_or_path"] = str(model)
    raw["data"]["train"]["path"] = data
    raw["training"].update(output_dir=str(tmp_path / "out"), max_steps=12, save_steps=100)
    run_entrypoint("sft", validate(raw).to_json())
    return tmp_path / "out"


# ---------------------------------------------------------------- small causal LMs and a padded batch of them

SHAPE = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
PAD = 0
# the architectures ``model`` builds at SHAPE
MODELS = ("llama", "qwen2", "qwen3")


def model(name: str, implementation: str) -> Any:
    """A seeded model of the architecture ``name``, attending with ``implementation``, with TRL's fused LM head."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from posttrain.entrypoints.speed import attention

    torch.manual_seed(0)
    built = {
        "llama": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE, attention_dropout=0.1)),
        "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SHAPE)),
        "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=16)),
    }[name]()
    if implementation == attention.NAME:
        attention.register()
    built.set_attn_implementation(implementation)
    add_fused_lm_head(built, outputs=("log_probs", "entropy"))
    # attention dropout off: the two paths must be deterministic
    return built.eval()


def batch(padding: str) -> Tuple[Any, Any, int]:
    """Prompt and completion ids, their mask and the completions' width, as TRL concatenates them: prompts of
    different lengths padded on the left ("left"), completions of different lengths padded on the right
    ("right"), or both."""
    import torch

    generator = torch.Generator().manual_seed(1)
    prompt_lengths = [3, 17, 9, 30, 1, 12] if padding in ("left", "both") else [14] * 6
    completion_lengths = [25, 4, 25, 11, 1, 19] if padding in ("right", "both") else [25] * 6
    width_p, width_c = max(prompt_lengths), max(completion_lengths)
    ids = torch.full((6, width_p + width_c), PAD)
    mask = torch.zeros_like(ids)
    for row, (p, c) in enumerate(zip(prompt_lengths, completion_lengths)):
        ids[row, width_p - p : width_p + c] = torch.randint(1, 300, (p + c,), generator=generator)
        mask[row, width_p - p : width_p + c] = 1
    return ids, mask, width_c


# ---------------------------------------------------------------- what a run wrote: metrics.jsonl, curves.png

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def lines(path: Path) -> List[Dict[str, Any]]:
    """The records, less their wall-clock ``time`` (checked: there, and never going back, where written)."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    times = [record.pop("time") for record in records if "time" in record]
    assert all(isinstance(t, float) for t in times) and times == sorted(times), times
    return records


def assert_valid_png(path: Path) -> Dict[str, Any]:
    """The file is a PNG that PIL decodes; returns the data embedded in it."""
    from PIL import Image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(path) as image:
        image.load()
        assert image.format == "PNG" and image.width > 300 and image.height > 200
    return curves.read_embedded(path)


def assert_metrics_match_the_trainer(output_dir: Path) -> List[Dict[str, Any]]:
    """metrics.jsonl holds trainer_state.json's log history (its closing entry left out), entry for entry."""
    records = lines(output_dir / curves.METRICS_FILE)
    assert records == log_history(output_dir)
    assert [record["step"] for record in records] == list(range(1, 41))
    return records
