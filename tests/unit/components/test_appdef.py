"""The AppDef every component builds: launcher, rendezvous, resources, env, validation."""

import dataclasses
import doctest
import inspect
import json
import shlex
from pathlib import Path

import pytest
import torchx.specs as specs
from torchx.components.component_test_base import ComponentTestCase

import posttrain.components
from golden_messages import MORE_MIN_THAN_MAX_NODES, NO_NODES, TYPO_OVERRIDE
from helpers import REPO, TEMPLATES
from posttrain.components import algorithms, launch
from posttrain.components.arguments import ARGS
from posttrain.components.launch import Launch
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.registry import SPEC_CLASSES

TINY = str(TEMPLATES / "sft" / "tiny.yaml")


def argv(app: specs.AppDef) -> list:
    role = app.roles[0]
    assert role.entrypoint == "bash" and role.args[0] == "-c"
    return shlex.split(role.args[1])


def embedded_spec(app: specs.AppDef) -> dict:
    args = argv(app)
    return json.loads(args[args.index("--spec-json") + 1].replace("$$", "$"))


def option(args: list, name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize(
    "j, nnodes, nproc, min_replicas, replicas",
    [("1x1", "1", "1", 1, 1), ("1x2", "1", "2", 1, 1), ("2x1", "2", "1", 2, 2), ("2:4x8", "2:4", "8", 2, 4)],
)
def test_topology(j: str, nnodes: str, nproc: str, min_replicas: int, replicas: int) -> None:
    app = algorithms.sft(spec=TINY, j=j)
    args = argv(app)
    role = app.roles[0]
    # several nodes: the rendezvous port is checked first, then the launcher replaces bash
    if replicas > 1:
        assert args[args.index("&&") + 1] == "exec"
        args = args[args.index("&&") + 2 :]
    assert args[:3] == ["python", "-m", "posttrain.entrypoints.launcher"]
    assert option(args, "--nnodes") == nnodes and option(args, "--nproc_per_node") == nproc
    assert (role.min_replicas, role.num_replicas) == (min_replicas, replicas)
    assert option(args, "--tee") == "3" and option(args, "--rdzv_backend") == "c10d"
    assert option(args, "--rdzv_id") == "${app_id}" and option(args, "--role") == ""
    assert option(args, "--max_restarts") == "0"
    assert args[args.index("-m", 3) + 1] == "posttrain.entrypoints.sft"
    endpoint = option(args, "--rdzv_endpoint")
    if replicas == 1:
        assert endpoint == "localhost:0"
    else:
        # torchx substitutes ${rank0_env} per scheduler; bash then expands the variable
        assert f"${{{specs.macros.rank0_env}:=localhost}}:29500" in role.args[1]
    assert role.port_map == {"c10d": 29500}
    assert embedded_spec(app)["training"]["output_dir"] == "outputs/sft-tiny"


@pytest.mark.parametrize(
    "j, host, port", [("1x2", "localhost", "0"), ("2x8", "${TORCHX_RANK0_HOST:=localhost}", "29512")]
)
def test_deepspeed_launcher_runs_one_runner_per_node_told_its_rank_and_rank0(j: str, host: str, port: str) -> None:
    app = algorithms.sft(spec=TINY, j=j, launcher="deepspeed", rdzv_port=29512)
    nnodes, nproc = j.split("x")
    values = specs.macros.Values(img_root="", app_id="app-1", replica_id="1", rank0_env="TORCHX_RANK0_HOST")
    args = shlex.split(values.substitute(app.roles[0].args[1]))
    # several nodes: after the port's check, and exec
    args = args[args.index("&&") + 2 :] if "&&" in args else args
    assert args[:3] == ["python", "-m", "posttrain.entrypoints.deepspeed_launcher"]
    assert (option(args, "--nnodes"), option(args, "--nproc_per_node")) == (nnodes, nproc)
    # the replica id
    assert option(args, "--node_rank") == "1"
    assert (option(args, "--master_addr"), option(args, "--master_port")) == (host, port)
    assert args[args.index("-m", 3) + 1] == "posttrain.entrypoints.sft" and "posttrain.entrypoints.launcher" not in args
    assert app.roles[0].num_replicas == app.roles[0].min_replicas == int(nnodes)


def test_rank0_endpoint_becomes_each_schedulers_variable() -> None:
    app = algorithms.sft(spec=TINY, j="2x1", rdzv_port=29511)
    values = specs.macros.Values(img_root="", app_id="app-1", replica_id="0", rank0_env="TORCHX_RANK0_HOST")
    command = values.substitute(app.roles[0].args[1])
    assert "${TORCHX_RANK0_HOST:=localhost}:29511" in command
    assert option(shlex.split(command), "--rdzv_id") == "app-1"


def test_resources_arguments_and_named_resources() -> None:
    role = algorithms.sft(spec=TINY, cpu=8, gpu=2, memMB=4096, j="1x2").roles[0]
    assert (role.resource.cpu, role.resource.gpu, role.resource.memMB) == (8, 2, 4096)
    assert algorithms.sft(spec=TINY, h="cpu.small", j="1x1").roles[0].resource == specs.named_resources["cpu.small"]


def test_gpu_named_resource_infers_processes_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    resource = specs.Resource(cpu=32, gpu=4, memMB=100_000)
    monkeypatch.setitem(specs._named_resource_factories, "test.gpu.4", lambda: resource)
    app = algorithms.sft(spec=TINY, h="test.gpu.4", j="2")
    args = argv(app)
    assert option(args, "--nnodes") == "2" and option(args, "--nproc_per_node") == "4"
    assert app.roles[0].resource.gpu == 4


def test_component_arguments_reach_the_role() -> None:
    env = {"WANDB_PROJECT": "p"}
    app = algorithms.sft(
        "training.max_steps=3",
        spec=TINY,
        name="exp/run1",
        env=env,
        max_retries=2,
        max_restarts=1,
        rdzv_backend="static",
        mounts=["type=bind", "src=/data", "dst=/data"],
        debug=True,
        tee=2,
        image="ghcr.io/me/posttrain:1",
    )
    role = app.roles[0]
    args = argv(app)
    assert app.name == "run1" and role.image == "ghcr.io/me/posttrain:1"
    assert role.env["WANDB_PROJECT"] == "p" and role.env["TORCHX_TRACKING_EXPERIMENT_NAME"] == "exp"
    assert role.env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert env == {"WANDB_PROJECT": "p"}, "the caller's env must not be modified"
    assert role.max_retries == 2 and option(args, "--max_restarts") == "1"
    assert option(args, "--node_rank") == "${replica_id}" and option(args, "--tee") == "2"
    assert role.mounts[0].src_path == "/data"
    assert embedded_spec(app)["training"]["max_steps"] == 3


def test_dollar_signs_in_the_spec_survive_torchx_macro_substitution() -> None:
    app = algorithms.sft("training.run_name=${app_id} $HOME $$", spec=TINY)
    values = specs.macros.Values(img_root="", app_id="X", replica_id="0", rank0_env="R")
    args = shlex.split(values.substitute(app.roles[0].args[1]))
    spec = json.loads(args[args.index("--spec-json") + 1])
    assert spec["training"]["run_name"] == "${app_id} $HOME $$"


def test_env_values_reach_the_job_byte_for_byte_through_torchx_macro_substitution() -> None:
    given = {"DATA_ROOT": "/a$$b", "NOTE": "${app_id} $HOME $$ $"}
    app = algorithms.sft(spec=TINY, env=given)
    values = specs.macros.Values(img_root="", app_id="X", replica_id="0", rank0_env="R")
    role = values.apply(app.roles[0])
    assert {key: role.env[key] for key in given} == given


def test_a_job_without_gpus_asked_for_sees_none_unless_told() -> None:
    # local_cwd runs on the host, whose GPUs the job would otherwise use
    assert algorithms.sft(spec=TINY).roles[0].env["CUDA_VISIBLE_DEVICES"] == ""
    assert "CUDA_VISIBLE_DEVICES" not in algorithms.sft(spec=TINY, gpu=2, j="1x2").roles[0].env
    assert "CUDA_VISIBLE_DEVICES" not in algorithms.sft(spec=TINY, h="gpu.small").roles[0].env
    told = algorithms.sft(spec=TINY, env={"CUDA_VISIBLE_DEVICES": "3"})
    assert told.roles[0].env["CUDA_VISIBLE_DEVICES"] == "3"
    # the vllm role has GPUs of its own
    server = str(TEMPLATES / "grpo" / "tiny-vllm-server.yaml")
    trainers, vllm = algorithms.grpo(spec=server, vllm_gpu=1).roles
    assert trainers.env["CUDA_VISIBLE_DEVICES"] == "" and "CUDA_VISIBLE_DEVICES" not in vllm.env


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"j": "2x"}, "-j '2x': expected [MIN:]NNODESxNPROC"),
        ({"j": "0x1"}, NO_NODES),
        ({"j": "3:2x1"}, MORE_MIN_THAN_MAX_NODES),
        ({"tee": 4}, "--tee 4: expected 0"),
        ({"rdzv_port": 70000}, "--rdzv_port 70000: expected a TCP port"),
        ({"rdzv_backend": "zk"}, "--rdzv_backend 'zk': expected one of c10d"),
        ({"max_retries": -1}, "--max_retries -1: must be 0 or more"),
        ({"max_restarts": -1}, "--max_restarts -1: must be 0 or more"),
        ({"memMB": -5}, "--memMB -5: must be positive"),
        ({"cpu": 0}, "--cpu 0: must be at least 1"),
        ({"h": "gpu.nope"}, "-h 'gpu.nope': unknown named resource. No named resource found for `gpu.nope`"),
        ({"mounts": ["type=magic"]}, "--mounts type=magic"),
    ],
)
def test_bad_component_arguments(kwargs: dict, expected: str) -> None:
    with pytest.raises(SpecError) as error:
        algorithms.sft(spec=TINY, **kwargs)
    assert expected in str(error.value)


@pytest.mark.parametrize("retries", [{"max_restarts": 1}, {"max_retries": 2}])
def test_resume_never_with_retries_is_refused_naming_both(retries: dict) -> None:
    ((flag, count),) = retries.items()
    with pytest.raises(SpecError) as error:
        algorithms.sft("resume=never", spec=TINY, **retries)
    assert str(error.value).startswith(
        f"resume: never and --{flag} {count} disagree: a retry after the first checkpoint"
    )
    algorithms.sft("resume=auto", spec=TINY, **retries)


def test_library_callers_get_a_spec_error_not_a_system_exit() -> None:
    with pytest.raises(SpecError, match="did you mean training.learning_rate"):
        algorithms.sft(TYPO_OVERRIDE, spec=TINY)


@pytest.mark.parametrize("algorithm", sorted(SPEC_CLASSES))
def test_every_algorithm_has_a_component_running_its_entrypoint(algorithm: str) -> None:
    component = getattr(algorithms, algorithm)
    app = component(spec=str(TEMPLATES / algorithm / "tiny.yaml"), j="1x2")
    args = argv(app)
    assert args[args.index("-m", 3) + 1] == f"posttrain.entrypoints.{algorithm}"
    assert embedded_spec(app)["algorithm"] == algorithm and app.roles[0].name == algorithm
    assert component.__doc__ is not None and f"posttrain.{algorithm} --spec templates/{algorithm}/" in component.__doc__


def test_every_component_takes_the_same_arguments_each_documented_in_help() -> None:
    from torchx.specs.file_linter import get_fn_docstring

    def signature(component):
        return {name: (p.kind, p.default, p.annotation) for name, p in inspect.signature(component).parameters.items()}

    # vllm_mode: server's role
    server = {"vllm_h": None, "vllm_gpu": 0, "vllm_replicas": 1, "vllm_tp": 1}
    for algorithm in SPEC_CLASSES:
        component = getattr(algorithms, algorithm)
        parameters = inspect.signature(component).parameters
        shared = {name: kind for name, kind in signature(component).items() if name not in server}
        assert shared == signature(algorithms.sft), algorithm
        # TRL's trainers with a vLLM server mode
        served = algorithm in ("grpo", "rloo", "online_dpo")
        assert {name: parameters[name].default for name in parameters if name in server} == (server if served else {})
        _, described = get_fn_docstring(component)
        assert list(parameters) == [name for name in ARGS if served or name not in server]
        for name in parameters:
            assert described[name] == ARGS[name].format(algorithm=algorithm), (algorithm, name)
        assert f"templates/{algorithm}/*.yaml" in described["spec"]


class TorchxComponentChecks(ComponentTestCase):
    def test_components_parse_as_torchx_components(self) -> None:
        for algorithm in SPEC_CLASSES:
            self.validate(algorithms, algorithm)


def test_the_job_imports_nothing_from_components_but_the_spec_package() -> None:
    """Every import in entrypoints/ of posttrain.components is of posttrain.components.spec, at module level."""
    import ast

    outside, nested = [], []
    for path in sorted((REPO / "entrypoints").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                if name.startswith("posttrain.components") and not name.startswith("posttrain.components.spec"):
                    outside.append(f"{path.name}:{node.lineno} {name}")
    for path in sorted((REPO / "components").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            # an import inside a function: a circle held open, or laziness
            if isinstance(node, ast.FunctionDef):
                nested += [
                    f"{path.relative_to(REPO)}:{inner.lineno}"
                    for inner in ast.walk(node)
                    if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("posttrain.")
                ]
    assert not outside, f"the job imports from components/ outside components/spec: {outside}"
    assert not nested, f"posttrain imports inside functions in components/: {nested}"


def test_torchx_finds_only_the_components_in_the_component_module() -> None:
    # torchx reads and lints every function of the module its entry point names, on every `torchx run`
    functions = {name for name, _ in inspect.getmembers(algorithms, inspect.isfunction)}
    # an algorithm each, the chain of them, and the evaluation
    assert functions == {*SPEC_CLASSES, "chain", "eval"}
    # and the package exports each of them (its lazy table names them again)
    assert set(posttrain.components.__all__) == {*SPEC_CLASSES, "chain", "eval", "SpecError"}


def test_a_multi_node_job_checks_its_rendezvous_port_before_the_launcher_listens(capsys) -> None:
    import socket

    from posttrain.entrypoints import rendezvous_port

    command = algorithms.sft(spec=TINY, j="2x1", rdzv_port=29555).roles[0].args[1]
    assert command.startswith(
        "python -m posttrain.entrypoints.rendezvous_port 29555 '${replica_id}' $${${rank0_env}:=localhost} '${app_id}' && "
        "exec python -m posttrain.entrypoints.launcher "
    )
    # one node: a port of its own
    assert "rendezvous_port" not in algorithms.sft(spec=TINY, j="1x2").roles[0].args[1]
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = str(holder.getsockname()[1])
        assert rendezvous_port.main([port, "0", "localhost", "sft-x1"]) == 2
        assert capsys.readouterr().err.startswith(f"posttrain: --rdzv_port {port} is in use on ")
        # the same host: node 0 says it
        assert rendezvous_port.main([port, "1", "localhost", "sft-x1"]) == 2
        # another host's port
        assert rendezvous_port.main([port, "1", "node-0.elsewhere", "sft-x1"]) == 0
        # node 0's own launcher, up already: the listener's command line names the job (here: this process's, whose
        # program stands for the run id in torchrun's)
        own = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert rendezvous_port.listener_command(int(port)) == own
        assert rendezvous_port.main([port, "1", "localhost", own.split()[0]]) == 0
        # node 1's torchrun on the same host started first and hosts the store: node 0 goes on and joins it
        assert rendezvous_port.main([port, "0", "localhost", own.split()[0]]) == 0
        assert capsys.readouterr().err == ""
    assert rendezvous_port.main([port, "0", "localhost", "sft-x1"]) == 0


def test_every_component_takes_the_launch_arguments_as_launch_defines_them() -> None:
    """torchx needs each component to list its arguments; ``launch.Launch`` defines them once (a chain and an
    evaluation run posttrain's launcher alone: no ``launcher``)."""
    fields = {field.name: (field.default, field.type) for field in dataclasses.fields(Launch)}
    for name in [*SPEC_CLASSES, "chain", "eval"]:
        component = getattr(algorithms, name)
        taken = {
            key: (parameter.default, parameter.annotation)
            for key, parameter in inspect.signature(component).parameters.items()
            if key not in ("overrides", "spec") and not key.startswith("vllm_")
        }
        expected = {key: value for key, value in fields.items() if name not in ("chain", "eval") or key != "launcher"}
        assert taken == expected, name


def test_the_topology_doctests() -> None:
    result = doctest.testmod(launch)
    assert result.failed == 0 and result.attempted > 0
