"""``training.vllm_mode: server``: the ``vllm`` role in the AppDef, and the Slurm and Kubernetes requests with both roles."""

import os
import re
from typing import Any

import pytest
from torchx.runner import get_runner
from torchx.schedulers.kubernetes_scheduler import sanitize_for_serialization

from helpers import TEMPLATES
from kubernetes_checks import check
from posttrain.components import algorithms
from posttrain.components.spec.generation import VLLM_TOKEN_VARIABLE
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.registry import SPEC_CLASSES

SERVER = str(TEMPLATES / "grpo" / "tiny-vllm-server.yaml")
COLOCATE = str(TEMPLATES / "grpo" / "tiny-vllm.yaml")


def app(spec: str = SERVER, algorithm: str = "grpo", *overrides: str, **kwargs: Any):
    return getattr(algorithms, algorithm)(*overrides, spec=spec, image="registry.example/posttrain:1", **kwargs)


def dryrun(scheduler: str, cfg: dict, **kwargs: Any) -> Any:
    with get_runner() as runner:
        return runner.dryrun(app(**kwargs), scheduler, cfg=cfg).request


def test_the_components_that_place_a_vllm_role_are_the_registrys() -> None:
    """``--vllm_*`` where the spec class runs a vllm role; elsewhere server mode is refused at submit, in one line."""
    import inspect

    for algorithm, cls in SPEC_CLASSES.items():
        parameters = inspect.signature(getattr(algorithms, algorithm)).parameters
        placing = {name for name in parameters if name.startswith("vllm_")}
        assert placing == ({"vllm_h", "vllm_gpu", "vllm_replicas", "vllm_tp"} if cls.vllm_role else set()), algorithm
    with pytest.raises(SpecError) as refused:
        app(str(TEMPLATES / "distill" / "tiny.yaml"), "distill", "training.use_vllm=true", "training.vllm_mode=server")
    assert refused.value.problems == [
        "training.vllm_mode: server needs the job's vllm role beside the trainers, which posttrain.distill does not "
        "run; use vllm_mode: colocate, or a server of your own (vllm_server_base_url)"
    ]


def test_server_mode_adds_a_vllm_role_the_trainers_find() -> None:
    trainers, server = app(j="2x1", max_restarts=1).roles
    assert (trainers.name, server.name) == ("grpo", "vllm")
    assert server.num_replicas == 1 and server.port_map == {"http": 8000}
    # the role's het group on Slurm is the one after the trainers' two; Volcano's task vllm-0; else this host
    # after the rendezvous port's check
    launch = trainers.args[1].split(" && ", 1)[1]
    assert launch.startswith(
        "POSTTRAIN_VLLM_HOST=$${SLURM_JOB_NODELIST_HET_GROUP_2:-$${VC_VLLM_0_HOSTS:-127.0.0.1}} exec python -m "
    )
    command = server.args[1]
    # the role listens where the trainers connect: the same host, resolved
    assert command.startswith(
        "POSTTRAIN_VLLM_HOST=$${SLURM_JOB_NODELIST_HET_GROUP_2:-$${VC_VLLM_0_HOSTS:-127.0.0.1}} python -m "
        "posttrain.entrypoints.vllm_server --spec-json "
    )
    # it waits for the trainers as long as a collective would, and for a restarted rank 0 (torchrun restarts)
    assert command.endswith("--tensor-parallel-size 1 --data-parallel-size 1 --first-contact-s 300 --lease-grace-s 300")


@pytest.fixture(autouse=True)
def token_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment as it was after each test: the component writes the job's token into it."""
    monkeypatch.setenv(VLLM_TOKEN_VARIABLE, "")
    monkeypatch.delenv(VLLM_TOKEN_VARIABLE)


def test_each_job_gets_a_token_of_its_own_in_the_environment_it_inherits_never_in_the_request() -> None:
    request = str(dryrun("slurm", {}, j="2x1"))
    first = os.environ[VLLM_TOKEN_VARIABLE]
    assert len(first) >= 40 and first not in request
    for scheduler, cfg in (("local_cwd", {}), ("kubernetes", {"queue": "default"})):
        assert os.environ[VLLM_TOKEN_VARIABLE] not in str(dryrun(scheduler, cfg))
    # a new one for each job this process submits
    assert os.environ[VLLM_TOKEN_VARIABLE] != first
    # exported by the user: theirs to keep
    os.environ[VLLM_TOKEN_VARIABLE] = "the-user-s-own"
    app()
    assert os.environ[VLLM_TOKEN_VARIABLE] == "the-user-s-own"


def test_no_role_for_colocate_or_a_server_the_spec_names() -> None:
    assert [role.name for role in app(COLOCATE).roles] == ["grpo"]
    external = app(SERVER, "grpo", "training.vllm_server_host=inference.example").roles
    assert [role.name for role in external] == ["grpo"] and "POSTTRAIN_VLLM_HOST" not in external[0].args[1]


def test_rloo_and_online_dpo_take_the_role_too() -> None:
    for algorithm in ("rloo", "online_dpo"):
        spec = str(TEMPLATES / algorithm / "tiny.yaml")
        roles = app(spec, algorithm, "training.use_vllm=true", "training.vllm_mode=server").roles
        assert [role.name for role in roles] == [algorithm, "vllm"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"vllm_tp": 0}, "--vllm_tp 0: must be at least 1"),
        ({"vllm_replicas": 0}, "--vllm_replicas 0: must be at least 1"),
        (
            {"vllm_gpu": 2, "vllm_tp": 2, "vllm_replicas": 2},
            "--vllm_gpu: 2 GPUs cannot hold 2 replica(s) of --vllm_tp 2",
        ),
        ({"gpu": 8}, "--vllm_gpu 0: the trainers have GPUs and TRL moves the weights to the server over NCCL"),
        ({"vllm_h": "gpu.h100.9"}, "--vllm_h 'gpu.h100.9': unknown named resource"),
    ],
)
def test_bad_server_arguments_are_one_line_each(kwargs: Any, message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        app(**kwargs)


def test_server_arguments_without_a_server_are_refused() -> None:
    with pytest.raises(SpecError, match=re.escape("--vllm_*: these place the server of training.vllm_mode: server")):
        app(COLOCATE, vllm_gpu=1)


def test_slurm_runs_both_roles_as_one_heterogeneous_job() -> None:
    request = dryrun("slurm", {}, j="2x1", vllm_gpu=2, vllm_tp=2, gpu=1)
    script = request.materialize()
    groups = dict(re.findall(r"#SBATCH --job-name=(\S+) (.*)", script))
    # het group 2 is the server's, as the trainers expect
    assert list(groups) == ["grpo-0", "grpo-1", "vllm-0"]
    assert script.count("#SBATCH hetjob") == 2
    assert groups["grpo-0"].endswith("--gpus-per-task=1") and groups["vllm-0"].endswith("--gpus-per-task=2")
    # both trainers' commands and the server's
    assert script.count("SLURM_JOB_NODELIST_HET_GROUP_2") == 3
    assert "posttrain.entrypoints.vllm_server" in script and "--tensor-parallel-size 2" in script


def test_kubernetes_gang_schedules_both_roles_in_one_volcano_job() -> None:
    request = dryrun("kubernetes", {"queue": "default"}, j="2x2", gpu=2, cpu=8, memMB=32_000, vllm_gpu=1)
    job = sanitize_for_serialization(request.resource)
    check(job)
    tasks = {task["name"]: task for task in job["spec"]["tasks"]}
    assert list(tasks) == ["grpo-0", "grpo-1", "vllm-0"]
    assert all(task.get("minAvailable", 1) == 1 and task["replicas"] == 1 for task in tasks.values())
    server = tasks["vllm-0"]["template"]["spec"]["containers"][0]
    assert server["resources"]["limits"] == {"cpu": "8000m", "memory": "32000M", "nvidia.com/gpu": "1"}
    assert server["ports"] == [{"containerPort": 8000, "name": "http"}]
    for name in ("grpo-0", "grpo-1"):
        command = tasks[name]["template"]["spec"]["containers"][0]["command"][2].split(" && ", 1)[1]
        assert command.startswith(
            "POSTTRAIN_VLLM_HOST=${SLURM_JOB_NODELIST_HET_GROUP_2:-${VC_VLLM_0_HOSTS:-127.0.0.1}}"
        )
