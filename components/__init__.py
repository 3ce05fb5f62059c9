"""posttrain's client side: the TorchX components, the spec and the AppDef builder.

Importing this package imports no torch, trl or transformers, so ``--dryrun``
and ``torchx builtins`` stay fast and work where only torchx is installed.
"""

from posttrain.components.algorithms import distill, dpo, grpo, kto, online_dpo, orpo, ppo, reward, rloo, sft
from posttrain.components.messages import SpecError

__all__ = ["SpecError", "distill", "dpo", "grpo", "kto", "online_dpo", "orpo", "ppo", "reward", "rloo", "sft"]
