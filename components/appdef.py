"""The AppDef builders the components share: a training algorithm's (with a ``vllm`` role in vLLM's server mode),
a chain's and an evaluation's, each validating the launch arguments (``launch.Launch``) and the spec first.

Built like torchx's ``dist.ddp``: one role running ``bash -c`` with posttrain's launcher (``launch.py``), and the
validated spec embedded as canonical JSON. With ``launcher="deepspeed"`` each node runs DeepSpeed's launcher
instead, through ``posttrain.entrypoints.deepspeed_launcher``.
"""

import functools
import os
import sys
from typing import Any, Callable, List, Optional, Sequence

import torchx.specs as specs
from torchx.components.structured_arg import StructuredNameArgument
from torchx.specs import macros

from posttrain.components import vllm_role
from posttrain.components.launch import (
    Launch,
    Topology,
    Unquoted,
    args_join,
    check_request_size,
    port_checked_first,
    rank0_address,
    valid_name,
)
from posttrain.components.spec.chain import load_chain
from posttrain.components.spec.evaluation import EvalSpec, load_eval
from posttrain.components.spec.generation import runs_vllm_server
from posttrain.components.spec.loading import load_spec
from posttrain.components.spec.local_files import local_data_problems, local_model_problems
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.schema import Spec
from posttrain.components.spec.shipped import spec_file
from posttrain.components.vllm_role import VllmServer

# The entry point torchx's CLI sets; a component called from it exits with the
# message alone (no traceback), library callers get the SpecError itself.
_TORCHX_CLI_CONTEXT = "cli_run"
CHAIN_MODULE = "posttrain.entrypoints.chain"
EVAL_MODULE = "posttrain.entrypoints.eval"


def _exit_cleanly_under_torchx_cli(build: Callable[..., specs.AppDef]) -> Callable[..., specs.AppDef]:
    """Library callers get SpecError; ``torchx run`` users get its message alone.

    torchx's CLI prints a traceback for any exception a component raises, but
    only the message of a SystemExit.
    """

    @functools.wraps(build)
    def wrapper(*args: Any, **kwargs: Any) -> specs.AppDef:
        try:
            return build(*args, **kwargs)
        except SpecError as error:
            if os.environ.get("TORCHX_CONTEXT_NAME") == _TORCHX_CLI_CONTEXT:
                raise SystemExit(str(error)) from None
            raise

    return wrapper


@_exit_cleanly_under_torchx_cli
def build_appdef(
    algorithm: str,
    overrides: Sequence[str],
    *,
    spec: str,
    vllm_h: Optional[str] = None,
    vllm_gpu: int = 0,
    vllm_replicas: int = 1,
    vllm_tp: int = 1,
    **launch_arguments: Any,
) -> specs.AppDef:
    """Validates the arguments and the spec, then builds the AppDef (with a ``vllm`` role in vLLM's server mode);
    ``launch_arguments`` are :class:`Launch`'s.

    Raises SpecError listing every problem found.
    """
    launch = Launch(**launch_arguments)
    resource, topology = launch.placed()
    server = VllmServer(vllm_h, vllm_gpu, vllm_replicas, vllm_tp)
    validated = load_spec(_spec_file(spec), overrides, algorithm=algorithm, world_size=topology.world_size)
    problems = _spec_problems(validated, launch, topology, resource)
    serve = runs_vllm_server(validated.training)
    if serve:
        problems += server.problems(trainer_gpus=resource.gpu)
    elif not server.is_default:
        problems.append(
            "--vllm_*: these place the server of training.vllm_mode: server (with use_vllm: true and no "
            "vllm_server_base_url/vllm_server_host); this spec runs no such server"
        )
    # those it sees
    problems += [] if problems else local_model_problems(validated) + local_data_problems(validated)
    if problems:
        raise SpecError(problems)

    module = f"posttrain.entrypoints.{algorithm}"
    # torchx substitutes ${...} macros in args with string.Template: "$$" keeps a "$" of the spec literal
    spec_json = validated.to_json().replace("$", "$$")
    cmd = launch.deepspeed_command(topology) if launch.launcher == "deepspeed" else launch.torchrun_command(topology)
    cmd += ["-m", module, "--spec-json", spec_json]
    if serve:
        cmd.insert(0, Unquoted(vllm_role.host_assignment(topology.max_nnodes)))
    # after the vLLM host's assignment
    cmd = port_checked_first(cmd, topology, launch.rdzv_port, at=1 if serve else 0)

    job_name = StructuredNameArgument.parse_from(name=launch.name or "/", m=module)
    role_env = launch.role_env(job_name, topology)
    roles = [launch.trainers_role(algorithm, topology, resource, cmd, role_env)]
    if serve:
        # in the environment the job inherits, not in the AppDef
        vllm_role.make_job_token()
        # the host the trainers connect to, resolved by the role to the address it listens on
        server_cmd = [Unquoted(vllm_role.host_assignment(topology.max_nnodes)), "python", "-m", vllm_role.MODULE]
        server_cmd += ["--spec-json", spec_json]
        server_cmd += vllm_role.server_args(server, validated.distributed.timeout_s, launch.max_restarts)
        roles.append(
            specs.Role(
                name=vllm_role.ROLE,
                image=launch.image,
                entrypoint="bash",
                resource=server.resource(launch.cpu, launch.memMB),
                args=["-c", args_join(server_cmd)],
                env=dict(role_env),
                port_map={"http": validated.training.get("vllm_server_port", 8000)},
                max_retries=launch.max_retries,
                mounts=launch.parsed_mounts(),
            )
        )
    check_request_size(launch.j, roles)
    return specs.AppDef(name=valid_name(job_name.run_name, algorithm), roles=roles)


@_exit_cleanly_under_torchx_cli
def build_chain_appdef(overrides: Sequence[str], *, spec: str, **launch_arguments: Any) -> specs.AppDef:
    """The AppDef of a chain: one role whose nodes run ``posttrain.entrypoints.chain``, which runs each stage with
    torchrun in turn. Every stage is checked here as if submitted alone; raises SpecError listing every problem,
    each naming its stage."""
    launch = Launch(**launch_arguments)
    resource, topology = launch.placed()
    j = launch.j
    if topology.min_nnodes != topology.max_nnodes:
        raise SpecError(
            [
                f"-j {j}: a chain runs a fixed number of nodes (a node that joined late would meet a stage "
                "the others have left); use -j NxP"
            ]
        )
    chain = load_chain(_spec_file(spec), overrides, world_size=topology.world_size)
    problems: List[str] = []
    # several nodes: each stage rendezvouses on a port of its own
    rdzv_port = launch.rdzv_port
    last_port = rdzv_port + len(chain.stages) - 1
    if topology.max_nnodes > 1 and launch.rdzv_backend in ("c10d", "static") and last_port > 65535:
        problems.append(f"--rdzv_port {rdzv_port}: the chain's stages use it up to {last_port}, past 65535")
    # not written yet, or half: the job's to check
    outputs = {stage.output_dir for stage in chain.stages}
    for stage in chain.stages:
        # an evaluation stage has no training to check against the request
        found = [] if isinstance(stage.spec, EvalSpec) else _spec_problems(stage.spec, launch, topology, resource)
        found += [] if found else local_model_problems(stage.spec, skip=outputs) + local_data_problems(stage.spec)
        problems += [f"stages.{stage.name}.{problem}" for problem in found]
    if problems:
        raise SpecError(problems)

    # after python -m module
    launcher = launch.torchrun_command(topology)[3:]
    host = rank0_address(topology, rdzv_port)[0]
    # torchx substitutes ${...} macros in args with string.Template: "$$" keeps a "$" of the spec literal
    chain_json = chain.to_json().replace("$", "$$")
    # the chain's process replaces bash, so a scheduler's SIGTERM reaches it (and it passes it to the stage's)
    cmd = [Unquoted("exec"), "python", "-m", CHAIN_MODULE, "--spec-json", chain_json]
    cmd += ["--node", macros.replica_id, "--rank0-host", host, "--", *launcher]
    job_name = StructuredNameArgument.parse_from(name=launch.name or "/", m=CHAIN_MODULE)
    roles = [launch.trainers_role("chain", topology, resource, cmd, launch.role_env(job_name, topology))]
    check_request_size(j, roles)
    return specs.AppDef(name=valid_name(job_name.run_name, "chain"), roles=roles)


@_exit_cleanly_under_torchx_cli
def build_eval_appdef(overrides: Sequence[str], *, spec: str, **launch_arguments: Any) -> specs.AppDef:
    """The AppDef of an evaluation: torchrun's processes share the prompts (``posttrain.entrypoints.eval``).
    Raises SpecError listing every problem found."""
    launch = Launch(**launch_arguments)
    resource, topology = launch.placed()
    validated = load_eval(_spec_file(spec), overrides)
    problems = local_model_problems(validated) + local_data_problems(validated)
    if problems:
        raise SpecError(problems)
    # torchx substitutes ${...} macros in args with string.Template: "$$" keeps a "$" of the spec literal
    cmd = launch.torchrun_command(topology)
    cmd += ["-m", EVAL_MODULE, "--spec-json", validated.to_json().replace("$", "$$")]
    cmd = port_checked_first(cmd, topology, launch.rdzv_port)
    job_name = StructuredNameArgument.parse_from(name=launch.name or "/", m=EVAL_MODULE)
    roles = [launch.trainers_role("eval", topology, resource, cmd, launch.role_env(job_name, topology))]
    check_request_size(launch.j, roles)
    return specs.AppDef(name=valid_name(job_name.run_name, "eval"), roles=roles)


def _spec_file(spec: str) -> str:
    """The file ``--spec`` names (``shipped.spec_file``); a template taken by its name is said, so that
    ``--dryrun`` shows which file ran."""
    path = spec_file(spec)
    if path != spec:
        print(f"posttrain: --spec {spec}: the shipped template {path}", file=sys.stderr)
    return path


def _spec_problems(validated: Spec, launch: Launch, topology: Topology, resource: specs.Resource) -> List[str]:
    """What a validated spec gets wrong with these launch arguments."""
    problems = []
    j, h = launch.j, launch.h
    # elastic: every size the job may shrink to
    for nodes in range(topology.min_nnodes, topology.max_nnodes):
        problems += [
            f"{problem} (at {nodes} nodes of -j {j})" for problem in validated.problems(nodes * topology.nproc_per_node)
        ]
    if h is not None and resource.gpu == 0:
        if validated.training.get("fp16"):
            problems.append(f"training.fp16: -h {h} has no GPU, and fp16 mixed precision needs one; use bf16 or none")
        problems += validated.distributed.gpu_problems(f"-h {h} has no GPU")
    max_retries, max_restarts = launch.max_retries, launch.max_restarts
    if validated.resume == "never" and (max_retries > 0 or max_restarts > 0):
        retry = f"--max_restarts {max_restarts}" if max_restarts > 0 else f"--max_retries {max_retries}"
        problems.append(
            f"resume: never and {retry} disagree: a retry after the first checkpoint would be refused (resume: never "
            "refuses a directory that holds checkpoints); use resume: auto, or drop the retries"
        )
    return problems
