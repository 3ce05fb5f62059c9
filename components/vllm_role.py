"""The ``vllm`` role an online algorithm's AppDef gets with ``training.vllm_mode: server``.

The role runs ``python -m posttrain.entrypoints.vllm_server`` (vLLM's server,
ended with the training) next to the trainers, in the same job, so every
scheduler places both at once: local_cwd starts both roles' processes,
Slurm makes one heterogeneous job (a group per replica, the trainers' first),
Kubernetes one Volcano job whose tasks are gang-scheduled. The trainers find
its host as the rendezvous finds rank 0, from the scheduler's variables.

A spec that names its own server (``vllm_server_base_url`` or
``vllm_server_host``) gets no role: the trainers use that server.
"""

import dataclasses
import os
import secrets
from typing import List, Optional

import torchx.specs as specs

from posttrain.components.spec.generation import VLLM_HOST_VARIABLE, VLLM_TOKEN_VARIABLE
from posttrain.components.spec.messages import SpecError

ROLE = "vllm"
MODULE = "posttrain.entrypoints.vllm_server"
# how long the server waits for a trainer torchrun restarts
RESTART_GRACE_S = 300


@dataclasses.dataclass(frozen=True)
class VllmServer:
    """The component's ``--vllm_*`` arguments: where the server runs and how it is split."""

    # a named resource
    h: Optional[str] = None
    gpu: int = 0
    # vLLM's data-parallel engines behind the one server
    replicas: int = 1
    # tensor-parallel GPUs per engine
    tp: int = 1

    def problems(self, trainer_gpus: int) -> List[str]:
        """What is wrong with the arguments, one line each; ``trainer_gpus``: the trainers' GPUs per host."""
        found = []
        if self.replicas < 1:
            found.append(f"--vllm_replicas {self.replicas}: must be at least 1")
        if self.tp < 1:
            found.append(f"--vllm_tp {self.tp}: must be at least 1")
        if self.gpu < 0:
            found.append(f"--vllm_gpu {self.gpu}: must be 0 or more")
        if found:
            return found
        gpus = self.resource(cpu=1, memMB=1).gpu
        if gpus and gpus < self.replicas * self.tp:
            found.append(f"--vllm_gpu: {gpus} GPUs cannot hold {self.replicas} replica(s) of --vllm_tp {self.tp}")
        elif trainer_gpus and not gpus:
            found.append(
                "--vllm_gpu 0: the trainers have GPUs and TRL moves the weights to the server over NCCL; "
                f"give the vllm role GPUs (--vllm_gpu {self.replicas * self.tp} or --vllm_h)"
            )
        return found

    def resource(self, cpu: int, memMB: int) -> specs.Resource:
        if self.h is not None:
            try:
                return specs.named_resources[self.h]
            except KeyError as e:
                raise SpecError([f"--vllm_h {self.h!r}: unknown named resource. {e.args[0]}"]) from None
        return specs.resource(cpu=cpu, gpu=max(self.gpu, 0), memMB=memMB)

    @property
    def is_default(self) -> bool:
        return self == VllmServer()


def host_assignment(trainer_nodes: int) -> str:
    """``POSTTRAIN_VLLM_HOST=...`` for bash, before the trainers' launcher and the role's server (which listens on
    the address the name resolves to).

    Slurm: the role's het group comes after the trainers' one per node; Volcano
    (Kubernetes): every pod has ``VC_<TASK>_HOSTS``, the role's task is
    ``vllm-0``; local_cwd: this host. "$$" escapes torchx's macro substitution.
    """
    return f"{VLLM_HOST_VARIABLE}=$${{SLURM_JOB_NODELIST_HET_GROUP_{trainer_nodes}:-$${{VC_VLLM_0_HOSTS:-127.0.0.1}}}}"


def make_job_token() -> None:
    """A new token for the job about to be submitted, in this process's environment: never in the AppDef.

    The job's processes inherit it where the scheduler passes the submitting
    environment on (local_cwd, Slurm); elsewhere the job reads the file that
    ``--env POSTTRAIN_VLLM_TOKEN_PATH`` names. A token the user exported is theirs
    to keep; the one this made for the previous job in this process is replaced.
    """
    if os.environ.get(VLLM_TOKEN_VARIABLE, _MADE[0]) == _MADE[0]:
        _MADE[0] = os.environ[VLLM_TOKEN_VARIABLE] = secrets.token_urlsafe(32)


# the last token make_job_token made
_MADE = [""]


def server_args(server: VllmServer, first_contact_s: int, max_restarts: int) -> List[str]:
    """The role's entrypoint arguments besides the spec."""
    return [
        "--tensor-parallel-size",
        str(server.tp),
        "--data-parallel-size",
        str(server.replicas),
        "--first-contact-s",
        str(first_contact_s),
        "--lease-grace-s",
        str(RESTART_GRACE_S if max_restarts > 0 else 0),
    ]
