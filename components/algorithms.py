"""TorchX components for LLM post-training, one per algorithm (``torchx run posttrain.<algorithm>``).

Each validates a YAML spec plus ``key.path=value`` overrides and returns the AppDef ``appdef.py`` builds.
torchx needs each component as a real function with its own signature; what an algorithm is lives in
``spec/registry.py``, its text (the docstring ``torchx run posttrain.<algorithm> --help`` shows) in
``spec/descriptions.py``, the shared ``Args:`` block in ``arguments.py``: ``arguments.component`` writes each
docstring from them.
"""

from typing import Dict, List, Optional

import torchx
import torchx.specs as specs

# modules, not their functions: torchx lints every function in this module as a component, on every run
from posttrain.components import appdef, arguments


@arguments.component
def sft(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
) -> specs.AppDef:
    return appdef.build_appdef("sft", **locals())


@arguments.component
def dpo(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
) -> specs.AppDef:
    return appdef.build_appdef("dpo", **locals())


@arguments.component
def reward(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
) -> specs.AppDef:
    return appdef.build_appdef("reward", **locals())


@arguments.component
def kto(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
) -> specs.AppDef:
    return appdef.build_appdef("kto", **locals())


@arguments.component
def orpo(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
) -> specs.AppDef:
    return appdef.build_appdef("orpo", **locals())


@arguments.component
def grpo(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
    vllm_h: Optional[str] = None,
    vllm_gpu: int = 0,
    vllm_replicas: int = 1,
    vllm_tp: int = 1,
) -> specs.AppDef:
    return appdef.build_appdef("grpo", **locals())


@arguments.component
def rloo(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
    vllm_h: Optional[str] = None,
    vllm_gpu: int = 0,
    vllm_replicas: int = 1,
    vllm_tp: int = 1,
) -> specs.AppDef:
    return appdef.build_appdef("rloo", **locals())


@arguments.component
def ppo(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
) -> specs.AppDef:
    return appdef.build_appdef("ppo", **locals())


@arguments.component
def distill(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
) -> specs.AppDef:
    return appdef.build_appdef("distill", **locals())


@arguments.component
def online_dpo(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
    j: str = "1x2",
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    max_restarts: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    debug: bool = False,
    tee: int = 3,
    launcher: str = "torchrun",
    vllm_h: Optional[str] = None,
    vllm_gpu: int = 0,
    vllm_replicas: int = 1,
    vllm_tp: int = 1,
) -> specs.AppDef:
    return appdef.build_appdef("online_dpo", **locals())


@arguments.component
def chain(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
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
    """A post-training chain in one job: named stages (SFT, reward model, PPO, DPO, ...) run in order on the
    same nodes, each handing its model to the next.

    The spec names the chain's ``output_dir`` and its ``stages``, each a spec
    (inline, or ``spec: <path>`` with sections to change);
    ``${stages.<name>.output}`` is an earlier stage's model. Every stage is
    checked before the job is submitted. Run the same command again after a
    kill or a preemption: finished stages are skipped and the stage it was in
    resumes from its newest checkpoint. Overrides address a stage:
    ``stages.<name>.<key.path>=value``.

    .. code-block:: shell-session

        $ torchx run -s local_cwd posttrain.chain --spec templates/chain/rlhf-tiny.yaml
        $ torchx run -s local_cwd posttrain.chain --spec templates/chain/sft-dpo-tiny.yaml stages.dpo.training.beta=0.2
    """
    return appdef.build_chain_appdef(**locals())


@arguments.component
def eval(
    *overrides: str,
    spec: str,
    image: str = torchx.IMAGE,
    name: Optional[str] = None,
    h: Optional[str] = None,
    cpu: int = 2,
    gpu: int = 0,
    memMB: int = 8192,
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
    """An evaluation: one or more models (a base and a trained one, say) sample completions of held-out prompts,
    which scorers in GRPO's rewards vocabulary score.

    Writes ``eval_summary.json`` (per model and scorer: mean, standard
    error, pass@k), ``eval_samples.jsonl`` (each prompt, completion and its
    scores) and a closing line comparing each model with the first. The
    job's processes share the prompts; each prompt's samples come from a
    seed of its own, so the scores are the same on any number of them.

    .. code-block:: shell-session

        $ torchx run -s local_cwd posttrain.eval --spec templates/eval/sft-tiny.yaml
    """
    return appdef.build_eval_appdef(**locals())
