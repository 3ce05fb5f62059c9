"""posttrain's client side: the TorchX components, the spec and the AppDef builder.

Importing this package imports no torch, trl or transformers, so ``--dryrun``
and ``torchx builtins`` stay fast and work where only torchx is installed.
The components and ``SpecError`` load on first use (PEP 562): a job reads its
spec with the spec modules alone, without the AppDef builder.
"""

import importlib
from typing import Any

_EXPORTS = {
    "SpecError": "posttrain.components.spec.messages",
    **{
        name: "posttrain.components.algorithms"
        for name in (
            "chain",
            "distill",
            "dpo",
            "eval",
            "grpo",
            "kto",
            "online_dpo",
            "orpo",
            "ppo",
            "reward",
            "rloo",
            "sft",
        )
    },
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
