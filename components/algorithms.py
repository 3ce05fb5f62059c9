"""TorchX components for LLM post-training, one per algorithm.

Each takes a YAML spec (``--spec``) plus ``key.path=value`` overrides,
validates them, and returns an AppDef that runs
``python -m posttrain.entrypoints.<algorithm>`` under torchrun, on any TorchX
scheduler::

    torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml
    torchx run -s slurm posttrain.sft --spec templates/sft/qwen2.5-0.5b.yaml -j 2x8 -h gpu.h100.8

torchx lists the functions defined in this module as ``posttrain.<name>``.
"""

from typing import Dict, List, Optional

import torchx
import torchx.specs as specs

from posttrain.components.appdef import build_appdef


def sft(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 1024,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
) -> specs.AppDef:
    """Supervised fine-tuning (trl.SFTTrainer) of a causal LM on chat or text data.

    Use it to teach a base model a format or a task from demonstrations, and as
    the first stage of an RLHF chain (SFT, then reward model, then PPO). The
    spec's ``training`` section holds ``trl.SFTConfig`` fields; the job writes
    the model, ``trainer_state.json`` and ``run_summary.json`` to
    ``training.output_dir``.

    .. code-block:: shell-session

        $ torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml
        $ torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml -j 1x2 training.max_steps=20
        $ torchx run -s slurm posttrain.sft --spec templates/sft/qwen2.5-0.5b.yaml -j 2x8 -h gpu.h100.8

    Args:
        overrides: ``key.path=value`` changes applied to the spec before validation (e.g. training.learning_rate=1e-5)
        spec: path to the YAML spec (templates/sft/*.yaml)
        image: image (e.g. docker) with posttrain installed; ignored by local_cwd
        name: job name, ``{experimentname}/{runname}`` or ``{runname}``; defaults to the algorithm
        h: a registered named resource (e.g. gpu.h100.8); takes precedence over cpu, gpu and memMB
        cpu: number of cpus per replica
        gpu: number of gpus per replica
        memMB: cpu memory in MB per replica
        j: [{min_nnodes}:]{nnodes}x{nproc_per_node}; with a GPU host (-h), {nnodes} alone uses one process per GPU
        env: environment variables for the job (e.g. WANDB_PROJECT=x); pass secrets here, never in the spec
        max_retries: scheduler retries of the whole job
        max_restarts: torchrun restarts of the workers on a node (how a local_cwd job retries)
        rdzv_port: port on the rank-0 host for the c10d store (multi-node only; one node picks a free port)
        rdzv_backend: torchrun rendezvous backend (c10d, static, etcd, etcd-v2)
        mounts: mounts for the job's containers (type=bind,src=/host,dst=/job[,readonly])
        debug: set PyTorch's distributed debug environment variables
        tee: streams teed to the console and log files: 0 none, 1 stdout, 2 stderr, 3 both
    """
    return build_appdef("sft", **locals())
