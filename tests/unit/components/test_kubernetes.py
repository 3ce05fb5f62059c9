"""Kubernetes requests from ``--dryrun``: every component's Volcano Job, checked offline.

No API server can run here, so each pod template is validated against the
Kubernetes OpenAPI schemas (kubernetes-validate, strict), the Volcano Job
against the schema the project ships, and the contents against what the job
needs: resources and GPU limits, env, the c10d port, the rank-0 endpoint that
``macros.rank0_env`` becomes (``VC_<ROLE>_0_HOSTS``), ``/dev/shm``, retries.
"""

import copy
import json
import re
from typing import Any, Dict

import jsonschema
import kubernetes_validate
import pytest
from torchx.runner import get_runner
from torchx.schedulers.kubernetes_scheduler import sanitize_for_serialization
from torchx.util.strings import normalize_str

from helpers import TEMPLATES
from kubernetes_checks import check, pods, resource_problems
from posttrain.components import algorithms
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.registry import SPEC_CLASSES


def request(algorithm: str, **kwargs: Any) -> Dict[str, Any]:
    component = getattr(algorithms, algorithm)
    app = component(spec=str(TEMPLATES / algorithm / "tiny.yaml"), image="registry.example/posttrain:1", **kwargs)
    with get_runner() as runner:
        info = runner.dryrun(app, "kubernetes", cfg={"queue": "default"})
    return sanitize_for_serialization(info.request.resource)


@pytest.mark.parametrize("algorithm", sorted(SPEC_CLASSES))
def test_every_component_makes_a_valid_volcano_job(algorithm: str) -> None:
    job = request(algorithm, j="2x2", gpu=2, cpu=8, memMB=32_000, max_retries=2, rdzv_port=29511)
    check(job)
    tasks = job["spec"]["tasks"]
    # Kubernetes names allow no underscore: online_dpo -> onlinedpo
    task_name = normalize_str(algorithm)
    assert [t["name"] for t in tasks] == [f"{task_name}-0", f"{task_name}-1"]
    assert job["spec"]["queue"] == "default" and job["spec"]["maxRetry"] == 2
    for replica, task in enumerate(tasks):
        assert task["maxRetry"] == 2
        container = task["template"]["spec"]["containers"][0]
        assert container["image"] == "registry.example/posttrain:1"
        assert container["resources"]["limits"] == {"cpu": "8000m", "memory": "32000M", "nvidia.com/gpu": "2"}
        assert container["ports"] == [{"containerPort": 29511, "name": "c10d"}]
        assert {"mountPath": "/dev/shm", "name": "dshm"} in container["volumeMounts"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PYTHONUNBUFFERED"] == "1"
        command = container["command"][2]
        assert container["command"][:2] == ["bash", "-c"]
        assert f"-m posttrain.entrypoints.{algorithm} --spec-json" in command
        assert "--nnodes 2 --nproc_per_node 2" in command
        # replica 0 hosts the rendezvous on localhost; the others reach it through Volcano's host list
        host_variable = "TORCHX_RANK0_HOST" if replica == 0 else f"VC_{task_name.upper()}_0_HOSTS"
        assert f"--rdzv_endpoint ${{{host_variable}:=localhost}}:29511" in command
        if replica == 0:
            assert env["TORCHX_RANK0_HOST"] == "localhost"


def test_a_broken_request_is_caught() -> None:
    job = request("sft", j="1x2")
    check(job)

    negative_memory = copy.deepcopy(job)
    negative_memory["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = "-1Gi"
    assert resource_problems(pods(negative_memory)[0])

    misspelled = copy.deepcopy(job)
    misspelled["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        check(misspelled)

    no_queue = copy.deepcopy(job)
    del no_queue["spec"]["queue"]
    with pytest.raises(jsonschema.ValidationError):
        check(no_queue)

    bad_name = copy.deepcopy(job)
    bad_name["spec"]["tasks"][0]["name"] = "SFT_0"
    with pytest.raises(jsonschema.ValidationError):
        check(bad_name)


def test_named_resources_reach_the_pods() -> None:
    job = request("grpo", h="gpu.h100.8", j="2")
    check(job)
    container = job["spec"]["tasks"][1]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "--nnodes 2 --nproc_per_node 8" in container["command"][2]


def test_the_deepspeed_launcher_finds_rank0_through_volcano() -> None:
    job = request("sft", h="gpu.h100.8", j="2", launcher="deepspeed", rdzv_port=29511)
    check(job)
    for replica, task in enumerate(job["spec"]["tasks"]):
        command = task["template"]["spec"]["containers"][0]["command"][2]
        host_variable = "TORCHX_RANK0_HOST" if replica == 0 else "VC_SFT_0_HOSTS"
        assert f"--node_rank {replica} --master_addr ${{{host_variable}:=localhost}} --master_port 29511" in command
        assert "--nnodes 2 --nproc_per_node 8" in command


def test_a_job_name_with_spaces_and_capitals_makes_labels_the_api_server_takes() -> None:
    job = request("sft", name="My Team/Run #1 (LR 3e-3)")
    check(job)
    labels = job["spec"]["tasks"][0]["template"]["metadata"]["labels"]
    assert labels["torchx.pytorch.org/app-name"] == "run-1-lr-3e-3"
    label_value = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
    assert all(label_value.match(value) and len(value) <= 63 for value in labels.values()), labels


def test_a_node_count_whose_request_kubernetes_cannot_hold_is_refused_naming_the_count_that_fits() -> None:
    with pytest.raises(SpecError) as error:
        request("sft", j="100000x8")
    message = str(error.value)
    assert message.startswith("-j 100000x8: the job's request holds every node's command, spec included (")
    fits = int(re.search(r"at most (\d+) nodes fit this spec", message).group(1))
    body = json.dumps(request("sft", j=f"{fits}x8"))
    # near the limit, under it
    assert len(body) <= 1.5 * 2**20 < len(body) / fits * (fits + 60)
