"""Every algorithm, described once: its spec class.

A spec class names the algorithm (its ``algorithm`` literal), the TRL config
``training`` is handed to, the trainer, the data it reads and its extra
models; the field tables, the job's checks and loading, the components' tests
and the AppDef all derive from it. Adding a TRL algorithm means a class here,
a component in ``algorithms.py``, a three-line entrypoint, a template and its
tests.
"""

from typing import ClassVar, Dict, List, Literal, Optional, Tuple, Type

from posttrain.components.fields import config_value
from posttrain.components.schema import Spec, _GroupSpec, _OnlineSpec, _ReferenceSpec

PREFERENCE_FORMATS: Tuple[Tuple[str, ...], ...] = (("prompt", "chosen", "rejected"), ("chosen", "rejected"))
LANGUAGE_MODELLING_FORMATS: Tuple[Tuple[str, ...], ...] = (("messages",), ("text",), ("prompt", "completion"))
PROMPT_FORMATS: Tuple[Tuple[str, ...], ...] = (("prompt",),)


class SFTSpec(Spec):
    """Supervised fine-tuning with ``trl.SFTTrainer``."""

    algorithm: Literal["sft"]
    config_class: ClassVar[str] = "trl:SFTConfig"
    trainer_class: ClassVar[Optional[str]] = "trl:SFTTrainer"
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = LANGUAGE_MODELLING_FORMATS


class DPOSpec(_ReferenceSpec):
    """Direct preference optimisation with ``trl.DPOTrainer``."""

    algorithm: Literal["dpo"]
    config_class: ClassVar[str] = "trl:DPOConfig"
    trainer_class: ClassVar[Optional[str]] = "trl:DPOTrainer"
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PREFERENCE_FORMATS


class RewardSpec(Spec):
    """Reward modelling (sequence classification) with ``trl.RewardTrainer``."""

    algorithm: Literal["reward"]
    config_class: ClassVar[str] = "trl:RewardConfig"
    trainer_class: ClassVar[Optional[str]] = "trl:RewardTrainer"
    model_class: ClassVar[str] = "AutoModelForSequenceClassification"
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PREFERENCE_FORMATS
    lora_task: ClassVar[str] = "SEQ_CLS"


class KTOSpec(_ReferenceSpec):
    """Kahneman-Tversky optimisation on unpaired labels with ``trl.KTOTrainer``."""

    algorithm: Literal["kto"]
    config_class: ClassVar[str] = "trl:KTOConfig"
    trainer_class: ClassVar[Optional[str]] = "trl:KTOTrainer"
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = (("prompt", "completion", "label"),)


class ORPOSpec(Spec):
    """Odds-ratio preference optimisation (no reference) with ``trl.experimental.orpo.ORPOTrainer``."""

    algorithm: Literal["orpo"]
    config_class: ClassVar[str] = "trl.experimental.orpo:ORPOConfig"
    trainer_class: ClassVar[Optional[str]] = "trl.experimental.orpo:ORPOTrainer"
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PREFERENCE_FORMATS


class GRPOSpec(_GroupSpec):
    """Group relative policy optimisation with ``trl.GRPOTrainer`` (GSPO: importance_sampling_level: sequence)."""

    algorithm: Literal["grpo"]
    config_class: ClassVar[str] = "trl:GRPOConfig"
    trainer_class: ClassVar[Optional[str]] = "trl:GRPOTrainer"
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PROMPT_FORMATS


class RLOOSpec(_GroupSpec):
    """REINFORCE leave-one-out with ``trl.RLOOTrainer``."""

    algorithm: Literal["rloo"]
    config_class: ClassVar[str] = "trl:RLOOConfig"
    trainer_class: ClassVar[Optional[str]] = "trl:RLOOTrainer"
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PROMPT_FORMATS


class DistillSpec(Spec):
    """On-policy knowledge distillation into the model from ``teacher_model`` with ``trl.DistillationTrainer``.

    The student generates completions of each prompt; the loss is the
    generalised Jensen-Shannon divergence (``beta``) between its and the
    teacher's next-token distributions on them. The two share a vocabulary.
    """

    algorithm: Literal["distill"]
    teacher_model: str
    config_class: ClassVar[str] = "trl:DistillationConfig"
    trainer_class: ClassVar[Optional[str]] = "trl:DistillationTrainer"
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PROMPT_FORMATS
    generates: ClassVar[bool] = True
    extra_models: ClassVar[Dict[str, str]] = {"teacher_model": "teacher_model"}
    package_owned_training_keys: ClassVar[Dict[str, str]] = {
        "teacher_model_name_or_path": "use teacher_model at the top level of the spec",
        "teacher_model_revision": "posttrain loads the teacher with model's revision and options",
        "teacher_model_init_kwargs": "posttrain loads the teacher with model's dtype and options",
    }

    def problems(self, world_size: Optional[int]) -> List[str]:
        found = super().problems(world_size)
        if not self.teacher_model.strip():
            found.append("teacher_model: expected a path or hub id of the teacher; got an empty string")
        return found


class OnlineDPOSpec(_ReferenceSpec, _OnlineSpec):
    """Online DPO with ``trl.experimental.online_dpo.OnlineDPOTrainer``.

    Two completions of each prompt are sampled and scored with ``rewards``;
    the better one is chosen, and DPO's loss trains on the pair against the
    reference (``reference_model``, a copy of the policy by default).
    """

    algorithm: Literal["online_dpo"]
    config_class: ClassVar[str] = "trl.experimental.online_dpo:OnlineDPOConfig"
    trainer_class: ClassVar[Optional[str]] = "trl.experimental.online_dpo:OnlineDPOTrainer"
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PROMPT_FORMATS
    package_owned_training_keys: ClassVar[Dict[str, str]] = {
        **_OnlineSpec.package_owned_training_keys,
        "reward_model_path": "use rewards: [{model: <path or hub id>}]",
    }


class PPOSpec(_OnlineSpec):
    """PPO with posttrain's own trainer: policy, frozen reference, value model, rewards.

    ``value_model`` (path or hub id) defaults to the reward model where the
    rewards hold exactly one, else to the policy's weights with a fresh
    score head; ``reference_model`` defaults to a second load of the policy.
    """

    algorithm: Literal["ppo"]
    reference_model: Optional[str] = None
    value_model: Optional[str] = None
    config_class: ClassVar[str] = "posttrain.entrypoints.ppo_trainer:PPOConfig"
    trainer_class: ClassVar[Optional[str]] = None  # entrypoints/ppo.py wires policy, value and rewards
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PROMPT_FORMATS
    extra_models: ClassVar[Dict[str, str]] = {"reference_model": "ref_policy", "value_model": "value_model"}

    def problems(self, world_size: Optional[int]) -> List[str]:
        found = super().problems(world_size)
        training = self.training
        if self.model.lora is not None:
            found.append("model.lora: posttrain's PPO trains full weights; remove model.lora")
        for sharding in ("deepspeed", "fsdp"):
            if getattr(self.distributed, sharding) is not None:
                found.append(f"distributed.{sharding}: posttrain's PPO runs on DDP; remove distributed.{sharding}")
        if self.data.eval is not None:
            found.append("data.eval: PPO does not evaluate; its logs score every rollout; remove data.eval")
        if training.get("gradient_accumulation_steps", 1) != 1:
            found.append("training.gradient_accumulation_steps: PPO updates per mini-batch; use training.num_mini_batches")
        per_device = config_value(self.config_class, training, "per_device_train_batch_size")
        mini_batches = config_value(self.config_class, training, "num_mini_batches")
        if mini_batches < 1 or per_device % mini_batches:
            found.append(
                f"training.num_mini_batches: {mini_batches} must divide per_device_train_batch_size ({per_device})"
            )
        if training.get("max_steps", -1) < 1:
            found.append("training.max_steps: PPO runs a fixed number of iterations; set max_steps")
        return found


SPEC_CLASSES: Dict[str, Type[Spec]] = {
    cls.name(): cls
    for cls in (SFTSpec, DPOSpec, RewardSpec, KTOSpec, ORPOSpec, GRPOSpec, RLOOSpec, PPOSpec, DistillSpec, OnlineDPOSpec)
}
