"""What a training spec's agent program (``agent:``, GRPO's) must be, beside the spec's other keys: where its
endpoint can generate, the options it would not use, and episodes the other processes can wait for."""

from typing import Any, Dict, List

from posttrain.components.spec.fields import config_value
from posttrain.components.spec.sections import (
    EPISODES_AT_ONCE,
    PLAY_GRACE_S,
    USER_CODE_TIMEOUT_S,
    DistributedSpec,
    EpisodeProgram,
    play_bound,
)


def agent_training_problems(
    program: EpisodeProgram,
    training: Dict[str, Any],
    config_class: str,
    distributed: DistributedSpec,
    reward_names: List[str],
    world_size: int,
) -> List[str]:
    """An agent program (or a verifiers environment) where it cannot train yet, with options it would not use, named
    as a reward of the spec is (``reward_names``), or with episodes that may outlast what the other processes wait
    for."""
    found = []
    if distributed.fsdp is not None or getattr(distributed.sharding, "zero_stage", None) == 3:
        found.append(
            f"distributed.{distributed.strategy}: an agent program's endpoint generates on each process apart, as "
            "its episodes call, and sharded weights make every process generate together; use DDP, or DeepSpeed "
            "ZeRO stage 1 or 2"
        )
    per_process = config_value(config_class, training, "per_device_train_batch_size") * (
        config_value(config_class, training, "steps_per_generation")
        or config_value(config_class, training, "gradient_accumulation_steps")
    )
    bound, waited = play_bound(program.timeout_s or USER_CODE_TIMEOUT_S, per_process), distributed.timeout_s
    if world_size > 1 and bound >= waited:
        found.append(
            f"{program.key}.timeout_s: a process's {per_process} episodes may take {bound:g} s "
            f"({program.key}.timeout_s each, "
            f"{EPISODES_AT_ONCE} at once, plus {PLAY_GRACE_S:g} s), not below distributed.timeout_s ({waited} s), "
            f"how long the other processes wait for them; give a shorter {program.key}.timeout_s, or a longer "
            "distributed.timeout_s"
        )
    if config_value(config_class, training, "remove_unused_columns") is True:
        found.append(
            "training.remove_unused_columns: true leaves each row its prompt alone, and the agent program reads the "
            "whole row; set it false"
        )
    if training.get("max_tool_calling_iterations") is not None:
        found.append("training.max_tool_calling_iterations: an agent program bounds its own rounds; drop it")
    tensor_parallel = training.get("vllm_tensor_parallel_size", 1)
    if training.get("use_vllm") and training.get("vllm_mode", "colocate") == "colocate" and tensor_parallel != 1:
        found.append(
            f"training.vllm_tensor_parallel_size: {tensor_parallel} processes of a colocated vLLM generate together, "
            "and an agent program's endpoint generates on each process apart, as its episodes call; use 1, or "
            "vllm_mode: server"
        )
    if program.scorer_name() in reward_names:
        found.append(
            f"{program.named_by}: its reward's name in the logs, {program.scorer_name()}, is another reward's too; "
            f"{program.rename}"
        )
    return found
