"""Fixtures and markers shared by the test suite."""

import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator

# No hub access, ever: in-process tests too (huggingface_hub reads these when it is first imported, so here,
# before any test module imports it). Jobs get their own through helpers.job_env.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="posttrain-tests-hf-")

import pytest
import torch
from trl.chat_template_utils import add_response_schema
from xdist.scheduler import LoadScopeScheduling

# the job side's logging set-up (bitsandbytes' import-time warning quieted) before any test imports PEFT
import posttrain.entrypoints  # noqa: F401
from helpers import HEARTBEAT_S, JOB_TOKEN, MISTRAL_FORMATS, REPO, STALE_S, assert_succeeded, run_template
from posttrain.components.spec.sections import ModelSpec
from posttrain.entrypoints.inputs.models import load_tokenizer
from posttrain.entrypoints.inputs.tiny import NAME_TOOLS


@pytest.fixture
def job_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as a job's rank 0, for ``runtime.run`` in process: the repository as its directory, its own
    ``HF_HOME``, and the ``posttrain`` logger restored afterwards (run() adds its handler and stops propagation)."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("RANK", "0")
    logger = logging.getLogger("posttrain")
    for attribute in ("propagate", "level"):
        monkeypatch.setattr(logger, attribute, getattr(logger, attribute))
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))


@pytest.fixture
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's own ``HF_HOME`` and datasets cache, under ``tmp_path`` (a module asks for it in its ``pytestmark``)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_home" / "datasets"))


@pytest.fixture
def isolated(hf_home: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``hf_home``, offline, and the ``posttrain`` logger restored afterwards (run() adds its handler)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    logger = logging.getLogger("posttrain")
    handlers, propagate = list(logger.handlers), logger.propagate
    yield
    logger.handlers, logger.propagate = handlers, propagate


@pytest.fixture
def short_intervals(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease's intervals of the tests (``helpers.HEARTBEAT_S``, ``STALE_S``) in this process."""
    from posttrain.entrypoints.process import lease

    monkeypatch.setattr(lease, "HEARTBEAT_S", HEARTBEAT_S)
    monkeypatch.setattr(lease, "STALE_S", STALE_S)


@pytest.fixture
def job_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process of the job has its token (the component made it in the environment the job inherits), and
    this one has taken none yet (a job run in process before takes its own out of the environment)."""
    from posttrain.components.spec.generation import VLLM_TOKEN_VARIABLE
    from posttrain.entrypoints.generation import vllm_token

    monkeypatch.setenv(VLLM_TOKEN_VARIABLE, JOB_TOKEN)
    monkeypatch.setattr(vllm_token, "_TAKEN", {})


@pytest.fixture(scope="module")
def mistral_models(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """A tiny random Mistral model around each of Mistral's own tokenizer files (``helpers.MISTRAL_FORMATS``)."""
    import mistral_common
    from transformers import MistralConfig, MistralForCausalLM

    shipped_files = Path(mistral_common.__file__).parent / "data"
    built = {}
    for name, (shipped, file, vocab) in MISTRAL_FORMATS.items():
        path = tmp_path_factory.mktemp("models") / name
        config = MistralConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            bos_token_id=1,
            eos_token_id=2,
        )
        MistralForCausalLM(config).save_pretrained(path)
        shutil.copy(shipped_files / shipped, path / file)
        built[name] = path
    return built


@pytest.fixture(scope="module")
def broken_specs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Spec files no validator reaches: YAML that does not parse, and YAML that is no mapping (``golden_messages``'
    ``{broken_yaml}`` and ``{list_yaml}``)."""
    directory = tmp_path_factory.mktemp("specs")
    (directory / "broken.yaml").write_text("algorithm: sft\nmodel: [unclosed\n")
    (directory / "list.yaml").write_text("- algorithm\n- sft\n")
    return {"broken_yaml": str(directory / "broken.yaml"), "list_yaml": str(directory / "list.yaml")}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs: room for the tiny model's first checkpoint (1.4 MB), not its second."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


@pytest.fixture(scope="session")
def tools_tokenizer() -> Any:
    """The tiny tools model's real tokenizer, with the schema TRL reads its calls back with."""
    found = load_tokenizer(NAME_TOOLS, ModelSpec(name_or_path=NAME_TOOLS), "left")
    add_response_schema(found)
    return found


@pytest.fixture(scope="session")
def session_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory shared by the session's expensive runs (the RLHF chain reuses outputs)."""
    return tmp_path_factory.mktemp("posttrain")


@pytest.fixture(scope="session")
def sft_1x2(session_tmp: Path) -> Path:
    """The tiny SFT run on one node with two processes; later stages start from it."""
    output_dir = session_tmp / "sft-1x2"
    result = run_template("sft/tiny.yaml", session_tmp, output_dir, j="1x2")
    assert_succeeded(result)
    # what the user saw
    (session_tmp / "sft-1x2.console").write_text(result.stdout + result.stderr)
    return output_dir


@pytest.fixture(scope="session")
def reward_model(session_tmp: Path) -> Path:
    """The tiny reward model; the RLHF chain scores PPO with it."""
    output_dir = session_tmp / "reward"
    assert_succeeded(run_template("reward/tiny.yaml", session_tmp, output_dir))
    return output_dir


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: runs real training jobs through torchx (a minute or more each)")
    config.addinivalue_line("markers", "slurm: needs the Slurm cluster that .ci/run starts")
    config.addinivalue_line("markers", "gpu: needs GPUs; deselected by default, run with pytest -m gpu")
    config.addinivalue_line(
        "markers", "vllm: needs vLLM (its own environment); deselected by default, run with pytest -m vllm"
    )


# what a test needs that a run gets only by asking for it with -m (any -m that names it, e.g. "gpu and not vllm")
ASKED_FOR = ("gpu", "vllm")


# each worker of `pytest -n 2` computes on one thread, as the jobs do (helpers.job_env): two workers' threads
# spinning on two cores each took a quarter more time
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

# README's `pytest -n 2` runs the end-to-end modules in two lanes side by side, each lane on one worker, in order:
# a module's tests and the session's shared runs stay on one worker. This lane's modules use no shared run, and
# take about as long as the other lane's (2026-12-06, 2 cores).
BESIDE_LANE = (
    "test_readme",
    "test_installed",
    "test_slurm",
    "test_tools",
    "test_reasoning",
    "test_chain",
    "test_benchmarks",
)


# end-to-end modules whose tests share no run, each test a unit of its own: vLLM's, which .ci/run runs apart, on both
# workers (8 min 12 s against 11 min 52 s on one, 2026-12-06, 2 cores); and verifiers' one chain (3 min 21 s), which
# the worker whose lane ends first takes (at the end of the "e2e" lane it ran alone its last 3 minutes, 2026-12-06)
EACH_ITS_OWN = ("test_vllm", "test_verifiers")


class Lanes(LoadScopeScheduling):
    """xdist's load, test by test, in the order collected (``--no-loadscope-reorder``, in setup.cfg: the fast tests
    first, on both workers), with each lane of end-to-end modules one unit of work. (xdist's own ``--dist
    loadgroup`` groups nothing under pytest 9, which keeps node ids elsewhere; by module, the fast tests took 4
    minutes 15 s instead of 2 minutes 53 s: heavy modules met on both workers.)"""

    def _split_scope(self, nodeid: str) -> str:
        if not nodeid.startswith("tests/e2e/") or Path(nodeid.partition("::")[0]).stem in EACH_ITS_OWN:
            return nodeid
        return "e2e-beside" if Path(nodeid.partition("::")[0]).stem in BESIDE_LANE else "e2e"


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Lanes:
    return Lanes(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Deselects the tests marked ``gpu`` or ``vllm`` unless ``-m`` names the mark: a ``-m "not e2e"`` of the
    user's replaces any configured ``-m``, so the default cannot live in ``addopts``."""
    asked = config.getoption("markexpr") or ""
    unasked = [mark for mark in ASKED_FOR if mark not in asked]
    kept, deselected = [], []
    for item in items:
        (deselected if any(item.get_closest_marker(mark) for mark in unasked) else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
