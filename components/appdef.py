"""The AppDef builder every algorithm's component shares.

Built like torchx's ``dist.ddp``: one role running ``bash -c`` with torchrun
(in ``posttrain.entrypoints.launcher``: a failure told in one line), c10d rendezvous on ``localhost:0``
for one node and on the scheduler's rank-0 host (``macros.rank0_env``) for
several, and the validated spec embedded as canonical JSON. With
``launcher="deepspeed"`` each node runs DeepSpeed's launcher instead, through
``posttrain.entrypoints.deepspeed_launcher``.
"""

import dataclasses
import functools
import json
import os
import re
import shlex
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torchx.specs as specs
from torchx.components.structured_arg import StructuredNameArgument
from torchx.specs import macros

from posttrain.components import vllm_role
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

RDZV_BACKENDS = ("c10d", "static", "etcd", "etcd-v2")
# Kubernetes' largest object (etcd's request limit), and what a pod template of a Volcano job holds besides its
# command, env and image (measured: about 1.2 KiB, 10 to 700 replicas of the tiny SFT)
MAX_REQUEST_BYTES = 3 * 2**19
POD_TEMPLATE_BYTES = 1200
# torchx adds "-" and a random suffix to make the Kubernetes job's name (63 characters at most)
MAX_NAME = 40
LAUNCHERS = ("torchrun", "deepspeed")
CHAIN_MODULE = "posttrain.entrypoints.chain"
EVAL_MODULE = "posttrain.entrypoints.eval"

# Environment variable names that hold secrets: never in --env, whose values are printed. A name is one when its
# last part says it (HF_TOKEN, WANDB_KEY, CLIENT_SECRET; not TOKENIZERS_PARALLELISM or KEY_PREFIX) or a password or
# credential is named anywhere in it.
SECRET_NAME = re.compile(
    r"(^|_)(TOKEN|KEY|SECRET)$|PASSWORD|PASSWD|CREDENTIAL"
    # AWS_ACCESS_KEY_ID is half of a key pair, set beside its secret key: refused so the pair travels one safe way
    r"|(^|_)ACCESS_KEY_ID$",
    re.IGNORECASE,
)
# ... unless the name says its value is where the secret lives (HF_TOKEN_PATH: a mounted file), not the secret
SECRET_LOCATION = re.compile(r"_(PATH|FILE|DIR)$", re.IGNORECASE)

_DEBUG_ENV: Dict[str, str] = {
    "CUDA_LAUNCH_BLOCKING": "1",
    "NCCL_DESYNC_DEBUG": "1",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "TORCH_SHOW_CPP_STACKTRACES": "1",
}


@dataclasses.dataclass(frozen=True)
class Topology:
    """The ``-j`` argument: ``[{min_nnodes}:]{nnodes}x{nproc_per_node}``, or ``{nnodes}`` with ``-h``.

    >>> Topology.parse("2:4x8")
    Topology(min_nnodes=2, max_nnodes=4, nproc_per_node=8)
    >>> Topology.parse("1x2").world_size
    2
    >>> Topology.parse("2", gpus_per_host=8)
    Topology(min_nnodes=2, max_nnodes=2, nproc_per_node=8)
    >>> Topology.parse("3")
    Topology(min_nnodes=1, max_nnodes=1, nproc_per_node=3)
    """

    min_nnodes: int
    max_nnodes: int
    nproc_per_node: int

    @property
    def world_size(self) -> int:
        """Processes at the full (maximum) node count."""
        return self.max_nnodes * self.nproc_per_node

    @property
    def nnodes_arg(self) -> str:
        """torchrun's ``--nnodes``: ``N``, or ``MIN:MAX`` when elastic."""
        if self.min_nnodes == self.max_nnodes:
            return str(self.max_nnodes)
        return f"{self.min_nnodes}:{self.max_nnodes}"

    @staticmethod
    def parse(j: str, gpus_per_host: int = 0) -> "Topology":
        """Parses ``-j``; a bare ``N`` is N nodes of one process per GPU on a GPU host, else 1xN as in dist.ddp."""
        usage = "expected [MIN:]NNODESxNPROC (e.g. 1x2, 2x8, 2:4x8), or NNODES with a GPU host (-h)"
        match = re.fullmatch(r"(?:(\d+):)?(\d+)x(\d+)|(\d+)", j.strip())
        if not match:
            raise SpecError([f"-j {j!r}: {usage}"])
        min_text, nodes_text, nproc_text, bare = match.groups()
        if bare is not None:
            if gpus_per_host > 0:
                nodes, nproc, low = int(bare), gpus_per_host, int(bare)
            else:
                nodes, nproc, low = 1, int(bare), 1
        else:
            nodes, nproc = int(nodes_text), int(nproc_text)
            low = int(min_text) if min_text is not None else nodes
        if nodes < 1 or nproc < 1 or low < 1:
            raise SpecError([f"-j {j!r}: node and process counts must be at least 1"])
        if low > nodes:
            raise SpecError([f"-j {j!r}: the minimum node count {low} exceeds the maximum {nodes}"])
        return Topology(low, nodes, nproc)


class _noquote(str):
    """An argument kept unquoted in the command line (a macro for bash to expand)."""


def _args_join(args: Iterable[str]) -> str:
    return " ".join(arg if isinstance(arg, _noquote) else shlex.quote(arg) for arg in args)


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
    image: str,
    name: Optional[str],
    h: Optional[str],
    cpu: int,
    gpu: int,
    memMB: int,
    j: str,
    env: Optional[Dict[str, str]],
    max_retries: int,
    max_restarts: int,
    rdzv_port: int,
    rdzv_backend: str,
    mounts: Optional[List[str]],
    debug: bool,
    tee: int,
    launcher: str,
    vllm_h: Optional[str] = None,
    vllm_gpu: int = 0,
    vllm_replicas: int = 1,
    vllm_tp: int = 1,
) -> specs.AppDef:
    """Validates the arguments and the spec, then builds the AppDef (with a ``vllm`` role in vLLM's server mode).

    Raises SpecError listing every problem found.
    """
    resource = _resource(h, cpu, gpu, memMB)
    server = VllmServer(vllm_h, vllm_gpu, vllm_replicas, vllm_tp)
    problems = _argument_problems(tee, rdzv_port, rdzv_backend, max_retries, max_restarts, launcher, env)
    if problems:
        raise SpecError(problems)
    topology = _topology(j, resource, launcher)
    validated = load_spec(_spec_file(spec), overrides, algorithm=algorithm, world_size=topology.world_size)
    problems += _spec_problems(validated, topology, j, h, resource, max_retries, max_restarts)
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
    if launcher == "deepspeed":
        cmd = _deepspeed_command(topology, rdzv_port)
    else:
        cmd = _torchrun_command(topology, rdzv_port, rdzv_backend, tee, max_restarts)
    cmd += ["-m", module, "--spec-json", spec_json]
    if serve:
        cmd.insert(0, _noquote(vllm_role.host_assignment(topology.max_nnodes)))
    # after the vLLM host's assignment
    cmd = _port_checked_first(cmd, topology, rdzv_port, at=1 if serve else 0)

    job_name = StructuredNameArgument.parse_from(name=name or "/", m=module)
    role_env = _role_env(job_name, env, topology, debug)
    roles = [
        _trainers_role(algorithm, image, topology, resource, cmd, role_env, rdzv_port, max_retries, mounts),
    ]
    if serve:
        # in the environment the job inherits, not in the AppDef
        vllm_role.make_job_token()
        # the host the trainers connect to, resolved by the role to the address it listens on
        server_cmd = [_noquote(vllm_role.host_assignment(topology.max_nnodes)), "python", "-m", vllm_role.MODULE]
        server_cmd += ["--spec-json", spec_json]
        server_cmd += vllm_role.server_args(server, validated.distributed.timeout_s, max_restarts)
        roles.append(
            specs.Role(
                name=vllm_role.ROLE,
                image=image,
                entrypoint="bash",
                resource=server.resource(cpu, memMB),
                args=["-c", _args_join(server_cmd)],
                env=dict(role_env),
                port_map={"http": validated.training.get("vllm_server_port", 8000)},
                max_retries=max_retries,
                mounts=_mounts(mounts),
            )
        )
    _check_request_size(j, roles)
    return specs.AppDef(name=_valid_name(job_name.run_name, algorithm), roles=roles)


@_exit_cleanly_under_torchx_cli
def build_chain_appdef(
    overrides: Sequence[str],
    *,
    spec: str,
    image: str,
    name: Optional[str],
    h: Optional[str],
    cpu: int,
    gpu: int,
    memMB: int,
    j: str,
    env: Optional[Dict[str, str]],
    max_retries: int,
    max_restarts: int,
    rdzv_port: int,
    rdzv_backend: str,
    mounts: Optional[List[str]],
    debug: bool,
    tee: int,
) -> specs.AppDef:
    """The AppDef of a chain: one role whose nodes run ``posttrain.entrypoints.chain``, which runs each stage with
    torchrun in turn. Every stage is checked here as if submitted alone; raises SpecError listing every problem,
    each naming its stage."""
    resource = _resource(h, cpu, gpu, memMB)
    problems = _argument_problems(tee, rdzv_port, rdzv_backend, max_retries, max_restarts, "torchrun", env)
    if problems:
        raise SpecError(problems)
    topology = _topology(j, resource, "torchrun")
    if topology.min_nnodes != topology.max_nnodes:
        raise SpecError(
            [
                f"-j {j}: a chain runs a fixed number of nodes (a node that joined late would meet a stage "
                "the others have left); use -j NxP"
            ]
        )
    chain = load_chain(_spec_file(spec), overrides, world_size=topology.world_size)
    # several nodes: each stage rendezvouses on a port of its own
    last_port = rdzv_port + len(chain.stages) - 1
    if topology.max_nnodes > 1 and rdzv_backend in ("c10d", "static") and last_port > 65535:
        problems.append(f"--rdzv_port {rdzv_port}: the chain's stages use it up to {last_port}, past 65535")
    # not written yet, or half: the job's to check
    outputs = {stage.output_dir for stage in chain.stages}
    for stage in chain.stages:
        # an evaluation stage has no training to check against the request
        found = (
            []
            if isinstance(stage.spec, EvalSpec)
            else _spec_problems(stage.spec, topology, j, h, resource, max_retries, max_restarts)
        )
        found += [] if found else local_model_problems(stage.spec, skip=outputs) + local_data_problems(stage.spec)
        problems += [f"stages.{stage.name}.{problem}" for problem in found]
    if problems:
        raise SpecError(problems)

    # after python -m module
    launcher = _torchrun_command(topology, rdzv_port, rdzv_backend, tee, max_restarts)[3:]
    host = _rank0_address(topology, rdzv_port)[0]
    # torchx substitutes ${...} macros in args with string.Template: "$$" keeps a "$" of the spec literal
    chain_json = chain.to_json().replace("$", "$$")
    # the chain's process replaces bash, so a scheduler's SIGTERM reaches it (and it passes it to the stage's)
    cmd = [_noquote("exec"), "python", "-m", CHAIN_MODULE, "--spec-json", chain_json]
    cmd += ["--node", macros.replica_id, "--rank0-host", host, "--", *launcher]
    job_name = StructuredNameArgument.parse_from(name=name or "/", m=CHAIN_MODULE)
    role_env = _role_env(job_name, env, topology, debug)
    roles = [_trainers_role("chain", image, topology, resource, cmd, role_env, rdzv_port, max_retries, mounts)]
    _check_request_size(j, roles)
    return specs.AppDef(name=_valid_name(job_name.run_name, "chain"), roles=roles)


def _argument_problems(
    tee: int,
    rdzv_port: int,
    rdzv_backend: str,
    max_retries: int,
    max_restarts: int,
    launcher: str,
    env: Optional[Dict[str, str]],
) -> List[str]:
    """The launch arguments' problems, before the spec is read."""
    problems = []
    if tee not in (0, 1, 2, 3):
        problems.append(f"--tee {tee}: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both)")
    if not 1 <= rdzv_port <= 65535:
        problems.append(f"--rdzv_port {rdzv_port}: expected a TCP port in 1..65535")
    if rdzv_backend not in RDZV_BACKENDS:
        problems.append(f"--rdzv_backend {rdzv_backend!r}: expected one of {', '.join(RDZV_BACKENDS)}")
    for flag, count in (("--max_retries", max_retries), ("--max_restarts", max_restarts)):
        problems += [f"{flag} {count}: must be 0 or more"] if count < 0 else []
    if launcher not in LAUNCHERS:
        problems.append(f"--launcher {launcher!r}: expected one of {', '.join(LAUNCHERS)}")
    if launcher == "deepspeed" and max_restarts > 0:
        problems.append(
            f"--max_restarts {max_restarts}: worker restarts are torchrun's; with --launcher deepspeed the "
            "scheduler retries the job (--max_retries)"
        )
    for key in env or {}:
        if SECRET_NAME.search(key) and not SECRET_LOCATION.search(key):
            problems.append(
                f"--env {key}: looks like a secret, and --env values show in --dryrun output and scheduler "
                f"requests; export {key} in the submitting shell (local_cwd and Slurm jobs inherit it) or use the "
                "scheduler's secrets (docs: Schedulers, Secrets)"
            )
    return problems


def _spec_file(spec: str) -> str:
    """The file ``--spec`` names (``shipped.spec_file``); a template taken by its name is said, so that
    ``--dryrun`` shows which file ran."""
    path = spec_file(spec)
    if path != spec:
        print(f"posttrain: --spec {spec}: the shipped template {path}", file=sys.stderr)
    return path


def _topology(j: str, resource: specs.Resource, launcher: str) -> Topology:
    topology = Topology.parse(j, gpus_per_host=resource.gpu)
    if launcher == "deepspeed" and topology.min_nnodes != topology.max_nnodes:
        raise SpecError(
            [f"-j {j}: DeepSpeed's launcher runs a fixed number of nodes; use -j NxP or --launcher torchrun"]
        )
    if resource.gpu > 0 and topology.nproc_per_node > resource.gpu:
        print(
            f"posttrain: warning: -j {j} runs {topology.nproc_per_node} processes per node on hosts with "
            f"{resource.gpu} GPUs",
            file=sys.stderr,
        )
    return topology


def _spec_problems(
    validated: Spec,
    topology: Topology,
    j: str,
    h: Optional[str],
    resource: specs.Resource,
    max_retries: int,
    max_restarts: int,
) -> List[str]:
    """What a validated spec gets wrong with these launch arguments."""
    problems = []
    # elastic: every size the job may shrink to
    for nodes in range(topology.min_nnodes, topology.max_nnodes):
        problems += [
            f"{problem} (at {nodes} nodes of -j {j})" for problem in validated.problems(nodes * topology.nproc_per_node)
        ]
    if h is not None and resource.gpu == 0:
        if validated.training.get("fp16"):
            problems.append(f"training.fp16: -h {h} has no GPU, and fp16 mixed precision needs one; use bf16 or none")
        problems += validated.distributed.gpu_problems(f"-h {h} has no GPU")
    if validated.resume == "never" and (max_retries > 0 or max_restarts > 0):
        retry = f"--max_restarts {max_restarts}" if max_restarts > 0 else f"--max_retries {max_retries}"
        problems.append(
            f"resume: never and {retry} disagree: a retry after the first checkpoint would be refused (resume: never "
            "refuses a directory that holds checkpoints); use resume: auto, or drop the retries"
        )
    return problems


def _role_env(
    job_name: StructuredNameArgument, env: Optional[Dict[str, str]], topology: Topology, debug: bool
) -> Dict[str, str]:
    # torchx substitutes macros in env values too: "$$" keeps every "$" the user wrote
    role_env = {key: value.replace("$", "$$") for key, value in (env or {}).items()}
    role_env["TORCHX_TRACKING_EXPERIMENT_NAME"] = job_name.experiment_name
    role_env.setdefault("LOGLEVEL", os.getenv("LOGLEVEL", "WARNING"))
    role_env.setdefault("PYTHONUNBUFFERED", "1")
    # torchrun's own default, without its
    if topology.nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        # banner; a value exported where the job is submitted is kept
        role_env.setdefault("OMP_NUM_THREADS", "1")
    if debug:
        role_env.update(_DEBUG_ENV)
    return role_env


def _trainers_role(
    name: str,
    image: str,
    topology: Topology,
    resource: specs.Resource,
    cmd: List[str],
    role_env: Dict[str, str],
    rdzv_port: int,
    max_retries: int,
    mounts: Optional[List[str]],
) -> specs.Role:
    return specs.Role(
        name=name,
        image=image,
        min_replicas=topology.min_nnodes,
        entrypoint="bash",
        num_replicas=topology.max_nnodes,
        resource=resource,
        args=["-c", _args_join(cmd)],
        # no GPU asked for: none used, also where the host has some that local_cwd (or a Slurm node without GPU
        # cgroups) would show; --env CUDA_VISIBLE_DEVICES=... says otherwise (the vllm role keeps its own GPUs)
        env={"CUDA_VISIBLE_DEVICES": "", **role_env} if resource.gpu == 0 else role_env,
        port_map={"c10d": rdzv_port},
        max_retries=max_retries,
        mounts=_mounts(mounts),
    )


def _valid_name(name: str, algorithm: str) -> str:
    """A job name every scheduler takes: Kubernetes labels its pods with it (lowercase letters, digits and dashes,
    at most 63 characters with the suffix torchx adds), as torchx's own ``normalize_str`` makes its job names."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:MAX_NAME] or algorithm


def _check_request_size(j: str, roles: List[specs.Role]) -> None:
    """A scheduler's request holds every replica's command, spec included (Kubernetes: a pod template each, at most
    1.5 MiB in all): a node count it cannot hold is refused here, with the count that fits."""

    def pod_bytes(role: specs.Role) -> int:
        # as the request's JSON holds them: the spec's quotes escaped
        return len(json.dumps(" ".join(role.args))) + len(json.dumps(role.env)) + len(role.image) + POD_TEMPLATE_BYTES

    total = sum(role.num_replicas * pod_bytes(role) for role in roles)
    if total > MAX_REQUEST_BYTES:
        trainers, others = roles[0], sum(role.num_replicas * pod_bytes(role) for role in roles[1:])
        fits = (MAX_REQUEST_BYTES - others) // pod_bytes(trainers)
        raise SpecError(
            [
                f"-j {j}: the job's request holds every node's command, spec included ({pod_bytes(trainers) / 1024:.1f} "
                f"KiB each): {total / 2**20:.1f} MiB at {trainers.num_replicas} nodes, over the "
                f"{MAX_REQUEST_BYTES / 2**20:.1f} MiB a Kubernetes object may hold; at most {fits} nodes fit this spec"
            ]
        )


def _rank0_address(topology: Topology, port: int) -> Tuple[str, int]:
    """One node: localhost, port 0 (the launcher picks a free one). Several: the scheduler's rank-0 host and ``port``.

    The host is left unquoted for bash to expand; "$$" escapes torchx's macro substitution.
    """
    if topology.max_nnodes == 1:
        return _noquote("localhost"), 0
    return _noquote(f"$${{{macros.rank0_env}:=localhost}}"), port


def _port_checked_first(cmd: List[Any], topology: Topology, rdzv_port: int, at: int = 0) -> List[Any]:
    """On several nodes: first, that the launcher's port is free (rendezvous_port.py); then the launcher replaces
    bash, as bash does by itself for one command, so a scheduler's SIGTERM reaches it (a pod's first process ignores
    it). ``at``: where the launcher starts in ``cmd`` (after an assignment it needs)."""
    if topology.max_nnodes <= 1:
        return cmd
    host = _rank0_address(topology, rdzv_port)[0]
    check = ["python", "-m", "posttrain.entrypoints.rendezvous_port", str(rdzv_port), macros.replica_id]
    return [*check, host, macros.app_id, _noquote("&&"), *cmd[:at], _noquote("exec"), *cmd[at:]]


def _torchrun_command(topology: Topology, port: int, rdzv_backend: str, tee: int, max_restarts: int) -> List[str]:
    cmd = [
        "python",
        "-m",
        "posttrain.entrypoints.launcher",
        "--rdzv_backend",
        rdzv_backend,
        "--rdzv_endpoint",
        _noquote("{}:{}".format(*_rank0_address(topology, port))),
        "--rdzv_id",
        f"{macros.app_id}",
        "--nnodes",
        topology.nnodes_arg,
        "--nproc_per_node",
        str(topology.nproc_per_node),
        "--tee",
        str(tee),
        "--role",
        "",
        "--max_restarts",
        str(max_restarts),
    ]
    if rdzv_backend == "static":
        cmd += ["--node_rank", _noquote(macros.replica_id)]
    return cmd


def _deepspeed_command(topology: Topology, port: int) -> List[str]:
    """DeepSpeed's launcher on every node, told its node rank and rank 0's address (it never uses ssh)."""
    host, master_port = _rank0_address(topology, port)
    return [
        "python",
        "-m",
        "posttrain.entrypoints.deepspeed_launcher",
        "--nnodes",
        str(topology.max_nnodes),
        "--nproc_per_node",
        str(topology.nproc_per_node),
        "--node_rank",
        _noquote(macros.replica_id),
        "--master_addr",
        host,
        "--master_port",
        str(master_port),
    ]


def _resource(h: Optional[str], cpu: int, gpu: int, memMB: int) -> specs.Resource:
    if h is not None:
        try:
            return specs.named_resources[h]
        except KeyError as e:
            raise SpecError([f"-h {h!r}: unknown named resource. {e.args[0]}"]) from None
    problems = []
    if cpu < 1:
        problems.append(f"--cpu {cpu}: must be at least 1")
    if gpu < 0:
        problems.append(f"--gpu {gpu}: must be 0 or more")
    if memMB < 1:
        problems.append(f"--memMB {memMB}: must be positive")
    if problems:
        raise SpecError(problems)
    return specs.resource(cpu=cpu, gpu=gpu, memMB=memMB)


def _mounts(mounts: Optional[List[str]]) -> List[Union[specs.BindMount, specs.VolumeMount, specs.DeviceMount]]:
    if not mounts:
        return []
    try:
        return specs.parse_mounts(mounts)
    except (KeyError, ValueError) as e:
        raise SpecError(
            [f"--mounts {','.join(mounts)}: {e}; expected type=bind,src=/host,dst=/job[,readonly]"]
        ) from None


@_exit_cleanly_under_torchx_cli
def build_eval_appdef(
    overrides: Sequence[str],
    *,
    spec: str,
    image: str,
    name: Optional[str],
    h: Optional[str],
    cpu: int,
    gpu: int,
    memMB: int,
    j: str,
    env: Optional[Dict[str, str]],
    max_retries: int,
    max_restarts: int,
    rdzv_port: int,
    rdzv_backend: str,
    mounts: Optional[List[str]],
    debug: bool,
    tee: int,
) -> specs.AppDef:
    """The AppDef of an evaluation: torchrun's processes share the prompts (``posttrain.entrypoints.eval``).
    Raises SpecError listing every problem found."""
    resource = _resource(h, cpu, gpu, memMB)
    problems = _argument_problems(tee, rdzv_port, rdzv_backend, max_retries, max_restarts, "torchrun", env)
    if problems:
        raise SpecError(problems)
    topology = _topology(j, resource, "torchrun")
    validated = load_eval(_spec_file(spec), overrides)
    problems += local_model_problems(validated) + local_data_problems(validated)
    if problems:
        raise SpecError(problems)
    # torchx substitutes ${...} macros in args with string.Template: "$$" keeps a "$" of the spec literal
    cmd = _torchrun_command(topology, rdzv_port, rdzv_backend, tee, max_restarts)
    cmd += ["-m", EVAL_MODULE, "--spec-json", validated.to_json().replace("$", "$$")]
    cmd = _port_checked_first(cmd, topology, rdzv_port)
    job_name = StructuredNameArgument.parse_from(name=name or "/", m=EVAL_MODULE)
    role_env = _role_env(job_name, env, topology, debug)
    roles = [_trainers_role("eval", image, topology, resource, cmd, role_env, rdzv_port, max_retries, mounts)]
    _check_request_size(j, roles)
    return specs.AppDef(name=_valid_name(job_name.run_name, "eval"), roles=roles)
