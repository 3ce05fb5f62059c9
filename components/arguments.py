"""A component's docstring, written once: its algorithm's description and the arguments every component takes.

torchx needs each component as a real function with its own signature (they
stay in ``algorithms.py``) and reads its docstring at run time for
``torchx run posttrain.<algorithm> --help``: :func:`component` writes it from
the algorithm's text (``spec/descriptions.py``, which the reference pages
render too) and appends the ``Args:`` block below.
"""

import inspect
import textwrap
from typing import Callable, Dict

import torchx.specs as specs

from posttrain.components.spec.descriptions import DESCRIPTIONS, facts

# Every component's arguments, as ``torchx run posttrain.<algorithm> --help`` shows them.
ARGS: Dict[str, str] = {
    "overrides": "``key.path=value`` changes applied to the spec before validation (e.g. training.learning_rate=1e-5); "
    "``~key.path`` removes a key",
    "spec": "path to the YAML spec (templates/{algorithm}/*.yaml)",
    "image": "image (e.g. docker) with posttrain installed; ignored by local_cwd",
    "name": "job name, ``{{experimentname}}/{{runname}}`` or ``{{runname}}``; defaults to the algorithm",
    "h": "a registered named resource (e.g. gpu.h100.8); takes precedence over cpu, gpu and memMB",
    "cpu": "number of cpus per replica",
    "gpu": "number of gpus per replica",
    "memMB": "cpu memory in MB per replica",
    "j": "[{{min_nnodes}}:]{{nnodes}}x{{nproc_per_node}}; with a GPU host (-h), {{nnodes}} alone uses one process per GPU",
    "env": "environment variables for the job (e.g. WANDB_PROJECT=x); not secrets: export those (docs: Schedulers, Secrets)",
    "max_retries": "scheduler retries of the whole job",
    "max_restarts": "torchrun restarts of the workers on a node (how a local_cwd job retries)",
    "rdzv_port": "port on the rank-0 host for the c10d store (multi-node only; one node picks a free port)",
    "rdzv_backend": "torchrun rendezvous backend (c10d, static, etcd, etcd-v2)",
    "mounts": "mounts for the job's containers (type=bind,src=/host,dst=/job[,readonly])",
    "debug": "set PyTorch's distributed debug environment variables",
    "tee": "streams teed to the console and log files: 0 none, 1 stdout, 2 stderr, 3 both",
    "launcher": "torchrun, or deepspeed (DeepSpeed's launcher, one per node; fixed -j, no max_restarts)",
    "vllm_h": "training.vllm_mode: server: a named resource for the vllm role (precedence over vllm_gpu)",
    "vllm_gpu": "training.vllm_mode: server: GPUs of the vllm role (cpu and memMB as the trainers')",
    "vllm_replicas": "training.vllm_mode: server: vLLM engines behind the server (its --data-parallel-size)",
    "vllm_tp": "training.vllm_mode: server: tensor-parallel GPUs per engine",
}


# torchx's --help prints the description as written (argparse's RawDescriptionHelpFormatter): wrap it for a terminal
HELP_WIDTH = 80


def _wrapped(text: str, indent: str = "") -> str:
    """``text`` filled to HELP_WIDTH, never inside a reST literal (``builtin: exact_match | contains`` stays whole)."""
    # odd parts are literals: their spaces become NULs while filling
    parts = text.split("``")
    glued = "``".join(part.replace(" ", "\0") if i % 2 else part for i, part in enumerate(parts))
    filled = textwrap.fill(glued, HELP_WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
    return filled.replace("\0", " ")


def description_docstring(algorithm: str) -> str:
    """An algorithm's description (``spec/descriptions.py``) as its component's docstring, before ``Args:``."""
    text = DESCRIPTIONS[algorithm]
    lines = [_wrapped(text.summary), "", _wrapped(text.use), ""]
    lines += [_wrapped(f"{label}: {line}", "    ") for label, line in facts(algorithm)]
    lines += ["", ".. code-block:: shell-session", ""] + [f"    $ {command}" for command in text.examples]
    return "\n".join(lines)


def component(fn: Callable[..., specs.AppDef]) -> Callable[..., specs.AppDef]:
    """Writes a component's docstring: its algorithm's description (chain, no algorithm: its own docstring), then
    the shared ``Args:`` block (the arguments it takes); the function is unchanged."""
    algorithm = fn.__name__
    if algorithm in DESCRIPTIONS and fn.__doc__:
        raise TypeError(f"posttrain.{algorithm}: its text is DESCRIPTIONS[{algorithm!r}] in spec/descriptions.py")
    text = description_docstring(algorithm) if algorithm in DESCRIPTIONS else inspect.cleandoc(fn.__doc__ or "")
    taken = inspect.signature(fn).parameters
    lines = "\n".join(f"    {arg}: {what.format(algorithm=algorithm)}" for arg, what in ARGS.items() if arg in taken)
    fn.__doc__ = f"{text}\n\nArgs:\n{lines}\n"
    return fn
