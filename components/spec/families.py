"""The families algorithms belong to, each a :class:`~posttrain.components.spec.schema.Spec` with what its
members share: a frozen reference policy, online generation scored by rewards, groups of generations."""

from typing import ClassVar, Dict, List, Optional, Tuple

from posttrain.components.spec.fields import config_value
from posttrain.components.spec.generation import TrainingGeneration
from posttrain.components.spec.schema import OWNED_KEYS, Spec
from posttrain.components.spec.sections import RewardSource
from posttrain.components.spec.values import generation_batch_problems


class ReferenceSpec(Spec):
    """Algorithms that regularise towards a frozen reference policy.

    ``reference_model`` (a path or hub id) defaults to a copy of the policy;
    with LoRA the reference is the policy with its adapter disabled.
    """

    reference_model: Optional[str] = None
    extra_models: ClassVar[Tuple[str, ...]] = ("reference_model",)

    def problems(self, world_size: Optional[int]) -> List[str]:
        found = super().problems(world_size)
        if self.reference_model is not None and self.model.lora is not None:
            found.append(
                "reference_model: not used with model.lora (the reference is the policy with its adapter "
                "disabled); remove one of them"
            )
        return found


class OnlineSpec(Spec):
    """Algorithms that generate completions and score them with ``rewards``."""

    rewards: List[RewardSource] = []
    generates: ClassVar[bool] = True
    owned_keys: ClassVar[Dict[str, str]] = {**OWNED_KEYS, "reward_weights": "use rewards[].weight"}

    def scored_elsewhere(self) -> bool:
        """Whether something besides ``rewards`` may score the samples (an environment's ``get_reward``)."""
        return False

    def problems(self, world_size: Optional[int]) -> List[str]:
        found = super().problems(world_size)
        if not self.rewards and not self.scored_elsewhere():
            found.append("rewards: give at least one reward (function, builtin or model)")
        for index, reward in enumerate(self.rewards):
            found += reward.problems(f"rewards.{index}")
        return found


class GroupSpec(OnlineSpec):
    """GRPO and RLOO: advantages compare ``num_generations`` completions of each prompt."""

    groups: ClassVar[bool] = True
    vllm_role: ClassVar[bool] = True
    vllm_owner: ClassVar[Optional[Tuple[str, str, str]]] = (
        "trl.generation.vllm_generation",
        "VLLMGeneration",
        "sync_weights",
    )
    # GRPO and RLOO count their tokens themselves
    batches_hold_input_ids: ClassVar[bool] = False
    # not Liger's layer kernels: they slowed GRPO's `generate` by a third on an H200 (BENCHMARKS.md)
    fast_paths: ClassVar[Tuple[str, ...]] = ("padding_free", "micro_batches", "rollout_generator")
    generates_with_sdpa: ClassVar[bool] = True

    generation: TrainingGeneration = TrainingGeneration()
    # its trainer keeps vLLM's log-probs, which correct samples of an older policy (generation.max_lag)
    corrects_stale_samples: ClassVar[bool] = False

    @property
    def keeps_only_prompts(self) -> bool:
        return config_value(self.config_class, self.training, "remove_unused_columns") is True

    def problems(self, world_size: Optional[int]) -> List[str]:
        found = super().problems(world_size) + self.generation.problems()
        if self.generation.runs_ahead:
            found += self.run_ahead_problems()
        bound, waited = self.generation.generate_timeout_s, self.distributed.timeout_s
        if bound is not None and (world_size or 1) > 1 and bound >= waited:
            found.append(
                f"generation.generate_timeout_s: {bound:g} s is not below distributed.timeout_s ({waited} s), how long "
                "the other processes wait for the samples: they would end the job first, saying less; raise "
                "distributed.timeout_s above it"
            )
        return found + generation_batch_problems(self.training, self.config_class, world_size or 1)

    def run_ahead_problems(self) -> List[str]:
        """What keeps the vllm role from generating ahead of training (``generation.max_lag`` above 0)."""
        lag = f"generation.max_lag: {self.generation.max_lag}"
        if not self.corrects_stale_samples:
            return [
                f"{lag}: {self.name()}'s trainer drops vLLM's log-probs, so samples of an older policy cannot be "
                "corrected; use max_lag: 0, or posttrain.grpo"
            ]
        if not self.training.get("use_vllm") or self.training.get("vllm_mode", "colocate") != "server":
            return [
                f"{lag}: the role that generates ahead is a vLLM server: set training.use_vllm: true and vllm_mode: server"
            ]
        found = []
        if config_value(self.config_class, self.training, "vllm_importance_sampling_correction") is False:
            found.append(
                "training.vllm_importance_sampling_correction: false leaves samples of an older policy uncorrected; "
                f"drop it with {lag}"
            )
        iterations = config_value(self.config_class, self.training, "num_iterations")
        if iterations != 1:
            found.append(
                f"training.num_iterations: {iterations} passes over each batch; with {lag} a batch is trained on once"
            )
        if self.data.eval is not None:
            found.append(
                f"data.eval: evaluation during training generates in lockstep; with {lag} drop it, or evaluate the "
                "trained model (evaluate:)"
            )
        accumulation = config_value(self.config_class, self.training, "gradient_accumulation_steps")
        steps = config_value(self.config_class, self.training, "steps_per_generation")
        if config_value(self.config_class, self.training, "generation_batch_size") is not None:
            found.append(
                f"training.generation_batch_size: with {lag} a generation batch must stay within one optimizer step; "
                f"set steps_per_generation instead (a divisor of gradient_accumulation_steps, {accumulation})"
            )
        elif steps is not None and accumulation % steps:
            found.append(
                f"training.steps_per_generation: {steps} micro-batches per generation would train one generation "
                f"over two optimizer steps, older than {lag} allows; use a divisor of gradient_accumulation_steps "
                f"({accumulation})"
            )
        if config_value(self.config_class, self.training, "restore_callback_states_from_checkpoint"):
            found.append(
                f"training.restore_callback_states_from_checkpoint: with {lag} the run-ahead's state comes back on "
                "resume by itself; drop it"
            )
        return found
