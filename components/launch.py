"""How a component's job is launched: every argument a component takes besides its spec (:class:`Launch`), and what
they make: the resource, the topology (``-j``), torchrun's or DeepSpeed's command, the environment and the role of
the nodes that train. Built like torchx's ``dist.ddp``: torchrun (in ``posttrain.entrypoints.launcher``: a failure
told in one line), c10d rendezvous on ``localhost:0`` for one node and on the scheduler's rank-0 host
(``macros.rank0_env``) for several.
"""

import dataclasses
import json
import os
import re
import shlex
import sys
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torchx
import torchx.specs as specs
from torchx.components.structured_arg import StructuredNameArgument
from torchx.specs import macros

from posttrain.components.spec.messages import SpecError

RDZV_BACKENDS = ("c10d", "static", "etcd", "etcd-v2")
# Kubernetes' largest object (etcd's request limit), and what a pod template of a Volcano job holds besides its
# command, env and image (measured: about 1.2 KiB, 10 to 700 replicas of the tiny SFT)
MAX_REQUEST_BYTES = 3 * 2**19
POD_TEMPLATE_BYTES = 1200
# torchx adds "-" and a random suffix to make the Kubernetes job's name (63 characters at most)
MAX_NAME = 40
LAUNCHERS = ("torchrun", "deepspeed")
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
class Launch:
    """A component's arguments besides its spec (``torchx run posttrain.<algorithm> --help`` describes each:
    ``arguments.ARGS``). torchx needs every component to list them in its own signature; this is their one
    definition, defaults included, which a test holds the signatures to."""

    image: str = torchx.IMAGE
    name: Optional[str] = None
    h: Optional[str] = None
    cpu: int = 2
    gpu: int = 0
    memMB: int = 8192
    j: str = "1x2"
    env: Optional[Dict[str, str]] = None
    max_retries: int = 0
    max_restarts: int = 0
    rdzv_port: int = 29500
    rdzv_backend: str = "c10d"
    mounts: Optional[List[str]] = None
    debug: bool = False
    tee: int = 3
    launcher: str = "torchrun"

    def problems(self) -> List[str]:
        """The launch arguments' problems, before the spec is read."""
        problems = []
        if self.tee not in (0, 1, 2, 3):
            problems.append(f"--tee {self.tee}: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both)")
        if not 1 <= self.rdzv_port <= 65535:
            problems.append(f"--rdzv_port {self.rdzv_port}: expected a TCP port in 1..65535")
        if self.rdzv_backend not in RDZV_BACKENDS:
            problems.append(f"--rdzv_backend {self.rdzv_backend!r}: expected one of {', '.join(RDZV_BACKENDS)}")
        for flag, count in (("--max_retries", self.max_retries), ("--max_restarts", self.max_restarts)):
            problems += [f"{flag} {count}: must be 0 or more"] if count < 0 else []
        if self.launcher not in LAUNCHERS:
            problems.append(f"--launcher {self.launcher!r}: expected one of {', '.join(LAUNCHERS)}")
        if self.launcher == "deepspeed" and self.max_restarts > 0:
            problems.append(
                f"--max_restarts {self.max_restarts}: worker restarts are torchrun's; with --launcher deepspeed the "
                "scheduler retries the job (--max_retries)"
            )
        for key in self.env or {}:
            if SECRET_NAME.search(key) and not SECRET_LOCATION.search(key):
                problems.append(
                    f"--env {key}: looks like a secret, and --env values show in --dryrun output and scheduler "
                    f"requests; export {key} in the submitting shell (local_cwd and Slurm jobs inherit it) or use "
                    "the scheduler's secrets (docs: Schedulers, Secrets)"
                )
        return problems

    def resource(self) -> specs.Resource:
        """Each node's resource: the named one (``-h``), else ``--cpu``, ``--gpu`` and ``--memMB``."""
        if self.h is not None:
            try:
                return specs.named_resources[self.h]
            except KeyError as e:
                raise SpecError([f"-h {self.h!r}: unknown named resource. {e.args[0]}"]) from None
        problems = []
        if self.cpu < 1:
            problems.append(f"--cpu {self.cpu}: must be at least 1")
        if self.gpu < 0:
            problems.append(f"--gpu {self.gpu}: must be 0 or more")
        if self.memMB < 1:
            problems.append(f"--memMB {self.memMB}: must be positive")
        if problems:
            raise SpecError(problems)
        return specs.resource(cpu=self.cpu, gpu=self.gpu, memMB=self.memMB)

    def placed(self) -> Tuple[specs.Resource, "Topology"]:
        """Each node's resource and the topology, once the arguments have no problem (a SpecError lists them)."""
        resource = self.resource()
        problems = self.problems()
        if problems:
            raise SpecError(problems)
        return resource, self.topology(resource)

    def topology(self, resource: specs.Resource) -> "Topology":
        """``-j`` on hosts of ``resource``."""
        topology = Topology.parse(self.j, gpus_per_host=resource.gpu)
        if self.launcher == "deepspeed" and topology.min_nnodes != topology.max_nnodes:
            raise SpecError(
                [f"-j {self.j}: DeepSpeed's launcher runs a fixed number of nodes; use -j NxP or --launcher torchrun"]
            )
        if resource.gpu > 0 and topology.nproc_per_node > resource.gpu:
            print(
                f"posttrain: warning: -j {self.j} runs {topology.nproc_per_node} processes per node on hosts with "
                f"{resource.gpu} GPUs",
                file=sys.stderr,
            )
        return topology

    def torchrun_command(self, topology: "Topology") -> List[str]:
        """posttrain's launcher (torchrun) on every node, up to the module it runs."""
        cmd = [
            "python",
            "-m",
            "posttrain.entrypoints.launcher",
            "--rdzv_backend",
            self.rdzv_backend,
            "--rdzv_endpoint",
            Unquoted("{}:{}".format(*rank0_address(topology, self.rdzv_port))),
            "--rdzv_id",
            f"{macros.app_id}",
            "--nnodes",
            topology.nnodes_arg,
            "--nproc_per_node",
            str(topology.nproc_per_node),
            "--tee",
            str(self.tee),
            "--role",
            "",
            "--max_restarts",
            str(self.max_restarts),
        ]
        if self.rdzv_backend == "static":
            cmd += ["--node_rank", Unquoted(macros.replica_id)]
        return cmd

    def deepspeed_command(self, topology: "Topology") -> List[str]:
        """DeepSpeed's launcher on every node, told its node rank and rank 0's address (it never uses ssh)."""
        host, master_port = rank0_address(topology, self.rdzv_port)
        return [
            "python",
            "-m",
            "posttrain.entrypoints.deepspeed_launcher",
            "--nnodes",
            str(topology.max_nnodes),
            "--nproc_per_node",
            str(topology.nproc_per_node),
            "--node_rank",
            Unquoted(macros.replica_id),
            "--master_addr",
            host,
            "--master_port",
            str(master_port),
        ]

    def role_env(self, job_name: StructuredNameArgument, topology: "Topology") -> Dict[str, str]:
        """The environment of the job's roles: ``--env`` and what posttrain sets."""
        # torchx substitutes macros in env values too: "$$" keeps every "$" the user wrote
        role_env = {key: value.replace("$", "$$") for key, value in (self.env or {}).items()}
        role_env["TORCHX_TRACKING_EXPERIMENT_NAME"] = job_name.experiment_name
        role_env.setdefault("LOGLEVEL", os.getenv("LOGLEVEL", "WARNING"))
        role_env.setdefault("PYTHONUNBUFFERED", "1")
        # torchrun's own default, without its
        if topology.nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
            # banner; a value exported where the job is submitted is kept
            role_env.setdefault("OMP_NUM_THREADS", "1")
        if self.debug:
            role_env.update(_DEBUG_ENV)
        return role_env

    def parsed_mounts(self) -> List[Union[specs.BindMount, specs.VolumeMount, specs.DeviceMount]]:
        if not self.mounts:
            return []
        try:
            return specs.parse_mounts(self.mounts)
        except (KeyError, ValueError) as e:
            raise SpecError(
                [f"--mounts {','.join(self.mounts)}: {e}; expected type=bind,src=/host,dst=/job[,readonly]"]
            ) from None

    def trainers_role(
        self,
        name: str,
        topology: "Topology",
        resource: specs.Resource,
        cmd: List[str],
        role_env: Dict[str, str],
    ) -> specs.Role:
        """The role whose nodes run ``cmd``: the trainers (an evaluation's, a chain's nodes)."""
        return specs.Role(
            name=name,
            image=self.image,
            min_replicas=topology.min_nnodes,
            entrypoint="bash",
            num_replicas=topology.max_nnodes,
            resource=resource,
            args=["-c", args_join(cmd)],
            # no GPU asked for: none used, also where the host has some that local_cwd (or a Slurm node without GPU
            # cgroups) would show; --env CUDA_VISIBLE_DEVICES=... says otherwise (the vllm role keeps its own GPUs)
            env={"CUDA_VISIBLE_DEVICES": "", **role_env} if resource.gpu == 0 else role_env,
            port_map={"c10d": self.rdzv_port},
            max_retries=self.max_retries,
            mounts=self.parsed_mounts(),
        )


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


class Unquoted(str):
    """An argument kept unquoted in the command line (a macro for bash to expand)."""


def args_join(args: Iterable[str]) -> str:
    return " ".join(arg if isinstance(arg, Unquoted) else shlex.quote(arg) for arg in args)


def valid_name(name: str, algorithm: str) -> str:
    """A job name every scheduler takes: Kubernetes labels its pods with it (lowercase letters, digits and dashes,
    at most 63 characters with the suffix torchx adds), as torchx's own ``normalize_str`` makes its job names."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:MAX_NAME] or algorithm


def check_request_size(j: str, roles: List[specs.Role]) -> None:
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


def rank0_address(topology: Topology, port: int) -> Tuple[str, int]:
    """One node: localhost, port 0 (the launcher picks a free one). Several: the scheduler's rank-0 host and ``port``.

    The host is left unquoted for bash to expand; "$$" escapes torchx's macro substitution.
    """
    if topology.max_nnodes == 1:
        return Unquoted("localhost"), 0
    return Unquoted(f"$${{{macros.rank0_env}:=localhost}}"), port


def port_checked_first(cmd: List[Any], topology: Topology, rdzv_port: int, at: int = 0) -> List[Any]:
    """On several nodes: first, that the launcher's port is free (rendezvous_port.py); then the launcher replaces
    bash, as bash does by itself for one command, so a scheduler's SIGTERM reaches it (a pod's first process ignores
    it). ``at``: where the launcher starts in ``cmd`` (after an assignment it needs)."""
    if topology.max_nnodes <= 1:
        return cmd
    host = rank0_address(topology, rdzv_port)[0]
    check = ["python", "-m", "posttrain.entrypoints.rendezvous_port", str(rdzv_port), macros.replica_id]
    return [*check, host, macros.app_id, Unquoted("&&"), *cmd[:at], Unquoted("exec"), *cmd[at:]]
