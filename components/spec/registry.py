"""Every algorithm, described once: its spec class.

A spec class names the algorithm (its ``algorithm`` literal), the TRL config
``training`` is handed to, the trainer, the data it reads and its extra
models; the field tables, the job's checks and loading, the components' tests
and the AppDef all derive from it. Its text in words (summary, data, models,
logs, refusals, examples) is ``descriptions.py``'s, keyed alike. Adding a TRL
algorithm means a class here, its description, a component in
``algorithms.py``, a three-line entrypoint, a template and its tests.
"""

import difflib
import fnmatch
from typing import Any, ClassVar, Dict, List, Literal, Optional, Tuple, Type

from posttrain.components.spec.agent_training import agent_training_problems
from posttrain.components.spec.families import GroupSpec, OnlineSpec, ReferenceSpec
from posttrain.components.spec.fields import config_fields, config_value
from posttrain.components.spec.schema import (
    CHECKPOINTING_OPTIONS,
    CHECKPOINTING_SWITCHES,
    OWNED_KEYS,
    REFUSED_KEYS,
    Spec,
)
from posttrain.components.spec.sections import PROMPT_FORMATS, AgentSection

PREFERENCE_FORMATS: Tuple[Tuple[str, ...], ...] = (("prompt", "chosen", "rejected"), ("chosen", "rejected"))
LANGUAGE_MODELLING_FORMATS: Tuple[Tuple[str, ...], ...] = (("messages",), ("text",), ("prompt", "completion"))


class SFTSpec(Spec):
    """Supervised fine-tuning with ``trl.SFTTrainer``."""

    algorithm: Literal["sft"]
    config_class: ClassVar[str] = "trl:SFTConfig"
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = LANGUAGE_MODELLING_FORMATS
    fast_paths: ClassVar[Tuple[str, ...]] = (
        "padding_free",
        "use_liger_kernel",
        "gpu_batch",
        "no_activation_checkpointing",
    )
    rows_hold_input_ids: ClassVar[bool] = True
    refused_keys: ClassVar[Dict[str, str]] = {
        **REFUSED_KEYS,
        # TRL reads one key of it, skip_prepare_dataset, which only works on rows tokenized already (input_ids)
        "dataset_kwargs": "the data is text, messages or prompt and completion, which the trainer must tokenize",
    }
    owned_keys: ClassVar[Dict[str, str]] = {
        **OWNED_KEYS,
        "dataset_text_field": "the data's text column is text: map yours with data.columns (e.g. {content: text})",
    }

    def problems(self, world_size: Optional[int]) -> List[str]:
        return super().problems(world_size) + self._selective_checkpointing_problems()

    def _selective_checkpointing_problems(self) -> List[str]:
        """What SFTTrainer refuses of its selective activation checkpointing once the model is loaded."""
        training = self.training
        options = [
            key
            for key in CHECKPOINTING_OPTIONS
            if isinstance(training.get(key), dict) and training[key].get("selective")
        ]
        if not options:
            return []
        key, switch = options[0], [k for k in CHECKPOINTING_SWITCHES if k in training]
        if switch and training[switch[0]] is False:
            return [
                f"training.{key}: selective: true cannot go with {switch[0]}: false; selective checkpointing "
                "is a kind of activation checkpointing: turn it on, or drop selective"
            ]
        if training[key].get("use_reentrant"):
            return [
                f"training.{key}: selective: true cannot go with use_reentrant: true; selective checkpointing "
                "is non-reentrant: set use_reentrant: false, or leave it unset"
            ]
        deepspeed = self.distributed.deepspeed
        if self.model.lora is not None and deepspeed is not None and deepspeed.zero_stage == 3:
            return [
                f"training.{key}: selective: true cannot go with model.lora under ZeRO-3, which needs reentrant "
                "checkpointing; drop selective, or use zero_stage 1 or 2"
            ]
        return []


class DPOSpec(ReferenceSpec):
    """Direct preference optimisation with ``trl.DPOTrainer``."""

    algorithm: Literal["dpo"]
    config_class: ClassVar[str] = "trl:DPOConfig"
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PREFERENCE_FORMATS
    refused_keys: ClassVar[Dict[str, str]] = {
        **REFUSED_KEYS,
        "padding_free": "TRL 1.16's DPOTrainer turns it off with a warning (temporarily unavailable there)",
    }


class RewardSpec(Spec):
    """Reward modelling (sequence classification) with ``trl.RewardTrainer``."""

    algorithm: Literal["reward"]
    config_class: ClassVar[str] = "trl:RewardConfig"
    model_class: ClassVar[str] = "AutoModelForSequenceClassification"
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PREFERENCE_FORMATS
    lora_task: ClassVar[str] = "SEQ_CLS"


class KTOSpec(ReferenceSpec):
    """Kahneman-Tversky optimisation on unpaired labels with ``trl.KTOTrainer``."""

    algorithm: Literal["kto"]
    config_class: ClassVar[str] = "trl:KTOConfig"
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = (("prompt", "completion", "label"),)


class ORPOSpec(Spec):
    """Odds-ratio preference optimisation (no reference) with ``trl.experimental.orpo.ORPOTrainer``."""

    algorithm: Literal["orpo"]
    config_class: ClassVar[str] = "trl.experimental.orpo:ORPOConfig"
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PREFERENCE_FORMATS
    batches_hold_input_ids: ClassVar[bool] = False
    # its collator needs the columns; else TRL sets it, and warns
    config_defaults: ClassVar[Dict[str, Any]] = {"remove_unused_columns": False}
    refused_keys: ClassVar[Dict[str, str]] = {
        **REFUSED_KEYS,
        "remove_unused_columns": "ORPO's collator needs every column, so TRL's trainer sets it to false whatever it is",
    }


class GRPOSpec(GroupSpec, AgentSection):
    """Group relative policy optimisation with ``trl.GRPOTrainer`` (GSPO: importance_sampling_level: sequence);
    with ``tools`` or an ``environment``, the model may call them while it answers, rounds of calls and results in
    one completion."""

    algorithm: Literal["grpo"]
    config_class: ClassVar[str] = "trl:GRPOConfig"
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PROMPT_FORMATS
    corrects_stale_samples: ClassVar[bool] = True

    def scored_elsewhere(self) -> bool:
        return self.environment is not None or self.agent is not None

    def run_ahead_problems(self) -> List[str]:
        found = super().run_ahead_problems()
        if self.tools or self.environment is not None or self.agent is not None:
            found.append(
                f"generation.max_lag: {self.generation.max_lag}: tool calls, environments and agent programs run "
                "between the role's turns, in lockstep; use max_lag: 0 with tools, an environment or an agent"
            )
        return found

    def problems(self, world_size: Optional[int]) -> List[str]:
        found = super().problems(world_size) + self.agent_problems()
        if self.environment_classes() is not None and self.keeps_only_prompts:
            found.append(
                "training.remove_unused_columns: true leaves each row its prompt alone, and the environment reads "
                "the whole row (reset(**row); several environments, its environment column); set it false"
            )
        program = self.program()
        if program is not None:
            named = [reward.scorer_name() for reward in self.rewards]
            found += agent_training_problems(
                program, self.training, self.config_class, self.distributed, named, world_size or 1
            )
        rounds = self.training.get("max_tool_calling_iterations")
        if rounds is not None and not self.is_agentic():
            found.append(
                f"training.max_tool_calling_iterations: {rounds} bounds the rounds of tool calls in a completion, "
                "and the spec gives no tools and no environment; add them, or drop it"
            )
        return found


class RLOOSpec(GroupSpec):
    """REINFORCE leave-one-out with ``trl.RLOOTrainer``."""

    algorithm: Literal["rloo"]
    config_class: ClassVar[str] = "trl:RLOOConfig"
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
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PROMPT_FORMATS
    generates: ClassVar[bool] = True
    extra_models: ClassVar[Tuple[str, ...]] = ("teacher_model",)
    owned_keys: ClassVar[Dict[str, str]] = {
        **OWNED_KEYS,
        "teacher_model_name_or_path": "use teacher_model at the top level of the spec",
        "teacher_model_revision": "posttrain loads the teacher with model's revision and options",
        "teacher_model_init_kwargs": "posttrain loads the teacher with model's dtype and options",
    }
    refused_keys: ClassVar[Dict[str, str]] = {
        **REFUSED_KEYS,
        "max_tool_calling_iterations": "posttrain's distillation gives the student no tools: it would bound nothing",
    }


# TRL 1.16's OnlineDPOTrainer leaves evaluation to transformers' Trainer, which runs the model on the prompt rows
NO_ONLINE_DPO_EVALUATION = "online DPO cannot evaluate: TRL's trainer runs the model's forward on prompts, which fails"
# the fields (fnmatch patterns) of transformers' evaluation, for the trainers that do not evaluate
EVALUATION_FIELDS = (
    "eval_*",
    "*_eval*",
    "do_predict",
    "prediction_loss_only",
    "include_for_metrics",
    "metric_for_best_model",
    "greater_is_better",
    "load_best_model_at_end",
)


def evaluation_fields(config_class: str) -> List[str]:
    """The fields of ``config_class`` that configure an evaluation."""
    fields = config_fields(config_class)
    return sorted(key for key in fields if any(fnmatch.fnmatchcase(key, pattern) for pattern in EVALUATION_FIELDS))


class OnlineDPOSpec(ReferenceSpec, OnlineSpec):
    """Online DPO with ``trl.experimental.online_dpo.OnlineDPOTrainer``.

    Two completions of each prompt are sampled and scored with ``rewards``;
    the better one is chosen, and DPO's loss trains on the pair against the
    reference (``reference_model``, a copy of the policy by default).
    """

    algorithm: Literal["online_dpo"]
    config_class: ClassVar[str] = "trl.experimental.online_dpo:OnlineDPOConfig"
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PROMPT_FORMATS
    vllm_role: ClassVar[bool] = True
    vllm_owner: ClassVar[Optional[Tuple[str, str, str]]] = (
        "trl.experimental.online_dpo.online_dpo_trainer",
        "OnlineDPOTrainer",
        "_move_model_to_vllm",
    )
    vllm_server_needs_gpus: ClassVar[bool] = True
    batches_hold_input_ids: ClassVar[bool] = False
    owned_keys: ClassVar[Dict[str, str]] = {
        **OnlineSpec.owned_keys,
        "reward_model_path": "use rewards: [{model: <path or hub id>}]",
    }
    refused_keys: ClassVar[Dict[str, str]] = {
        **REFUSED_KEYS,
        "remove_unused_columns": "online DPO's rows are prompts, which the model's forward does not take: true "
        "removes every column and training fails as it starts (false is TRL's default)",
        **dict.fromkeys(evaluation_fields(config_class), NO_ONLINE_DPO_EVALUATION),
    }
    refused_sections: ClassVar[Dict[str, str]] = {"data.eval": NO_ONLINE_DPO_EVALUATION}


class PPOSpec(OnlineSpec):
    """PPO with posttrain's own trainer: policy, frozen reference, value model, rewards.

    ``value_model`` (path or hub id) defaults to the reward model where the
    rewards hold exactly one, else to the policy's weights with a fresh
    score head; ``reference_model`` defaults to a second load of the policy.

    ``training`` takes only the fields the trainer honours
    (``honoured_keys``); every other field of its config is refused with the
    reason (``refused_keys``, computed from the field table, so a
    field a new transformers adds is refused until the trainer honours it).
    """

    algorithm: Literal["ppo"]
    reference_model: Optional[str] = None
    value_model: Optional[str] = None
    config_class: ClassVar[str] = "posttrain.entrypoints.trainers.ppo_trainer:PPOConfig"
    # its passes over prompt + response rows, as GRPO's (entrypoints/trainers/ppo_models.py)
    fast_paths: ClassVar[Tuple[str, ...]] = ("padding_free",)
    generates_with_sdpa: ClassVar[bool] = True
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PROMPT_FORMATS
    extra_models: ClassVar[Tuple[str, ...]] = ("reference_model", "value_model")

    # the fields of PPOConfig that posttrain's PPO trainer (or the runtime around it) reads; keep in step
    # with entrypoints/trainers/ppo_trainer.py (the registry does not import it: the client stays light)
    honoured_keys: ClassVar[frozenset] = frozenset(
        {
            # PPO's own
            "num_ppo_epochs",
            "num_mini_batches",
            "max_prompt_length",
            "max_completion_length",
            "temperature",
            "kl_coef",
            "kl_estimator",
            "adaptive_kl",
            "kl_target",
            "kl_horizon",
            "gamma",
            "lam",
            "cliprange",
            "cliprange_value",
            "vf_coef",
            "missing_eos_penalty",
            # the loop, the batch, saving and logging
            "output_dir",
            "max_steps",
            "per_device_train_batch_size",
            "seed",
            "logging_steps",
            "save_steps",
            "save_total_limit",
            "include_num_input_tokens_seen",
            "log_level",
            "log_level_replica",
            "log_on_each_node",
            # the optimizer (Trainer.get_optimizer_cls_and_kwargs) and the schedule (get_scheduler)
            "optim",
            "optim_args",
            "optim_target_modules",
            "learning_rate",
            "weight_decay",
            "adam_beta1",
            "adam_beta2",
            "adam_epsilon",
            "max_grad_norm",
            "lr_scheduler_type",
            "lr_scheduler_kwargs",
            "warmup_steps",
            # precision (accelerate's autocast; tf32 is set by TrainingArguments itself) and memory
            "bf16",
            "fp16",
            "tf32",
            "activation_checkpointing",
            "activation_checkpointing_kwargs",
            "gradient_checkpointing",
            "gradient_checkpointing_kwargs",
            # report_to's integration callbacks
            "report_to",
            "run_name",
            "project",
            "trackio_space_id",
            "trackio_bucket_id",
            "trackio_static_space_id",
            "hub_private_repo",
        }
    )
    # why a field is refused: the first rule with a matching (fnmatch) pattern; the rest get a generic reason
    refusal_reasons: ClassVar[Tuple[Tuple[Tuple[str, ...], str], ...]] = (
        (
            ("gradient_accumulation_steps",),
            "PPO steps the optimizer once per mini-batch; use training.num_mini_batches",
        ),
        (("num_train_epochs",), "PPO runs max_steps iterations (num_ppo_epochs: passes over each rollout)"),
        (EVALUATION_FIELDS, "PPO does not evaluate; its logs score every rollout"),
        (("label_*",), "PPO has no labels: rewards score its own samples"),
        (("push_to_hub", "hub_*"), "PPO does not push to the Hub; upload output_dir when the run is done"),
        (("torch_compile*",), "posttrain's PPO does not compile the models"),
        (
            ("dataloader_*", "data_seed", "ignore_data_skip", "train_sampling_strategy", "length_column_name"),
            "PPO draws its prompts itself (a shuffle seeded by seed, resumed by iteration), with no data loader",
        ),
        (("remove_unused_columns",), "PPO keeps every column: reward functions receive them"),
        (("auto_find_batch_size",), "PPO's batch is per_device_train_batch_size prompts, checked, never shrunk"),
        (("skip_memory_metrics",), "posttrain's PPO does not measure memory"),
        (("ddp_*",), "posttrain's PPO wraps policy and value in DDP with accelerate's defaults"),
        (("*liger*",), "posttrain's PPO does not patch the models with Liger kernels"),
        (("use_cache",), "PPO generates with the KV cache and trains without it; it sets this itself"),
        (("disable_tqdm",), "posttrain's PPO prints plain progress lines, never a bar"),
        (("logging_strategy",), "PPO logs the first iteration and every logging_steps iterations; set logging_steps"),
        (("logging_first_step",), "PPO always logs the first iteration"),
        (("save_strategy",), "PPO saves a checkpoint every save_steps iterations; set save_steps"),
        (("save_only_model",), "PPO checkpoints hold the optimizer and scheduler too, so a run can resume"),
        (("save_on_each_node",), "PPO saves on rank 0 only; output_dir must be shared by every node"),
        (("restore_callback_states_from_checkpoint",), "PPO checkpoints hold no callback states"),
        (("enable_jit_checkpoint",), "posttrain checkpoints on SIGTERM itself (resume: auto continues from it)"),
        (("average_tokens_across_devices",), "PPO averages each loss over its mini-batch; DDP averages across ranks"),
    )
    # values of honoured fields that need HF Trainer's own loop: value -> why
    refused_values: ClassVar[Dict[str, Dict[str, str]]] = {
        "optim": dict.fromkeys(
            (
                "lomo",
                "adalomo",
                "galore_adamw_layerwise",
                "galore_adamw_8bit_layerwise",
                "galore_adafactor_layerwise",
                "apollo_adamw_layerwise",
            ),
            "it steps inside HF Trainer's backward pass (LOMO, layer-wise GaLore and APOLLO); use another optim, "
            "such as adamw_torch_fused (the default)",
        ),
        "lr_scheduler_type": dict.fromkeys(
            ("reduce_lr_on_plateau", "greedy"),
            "it steps on an evaluation metric and PPO does not evaluate; use linear, cosine, constant, ...",
        ),
    }

    # called once below, then deleted: not a method
    def _refusals(
        config_class: str, honoured: frozenset, rules: Tuple[Tuple[Tuple[str, ...], str], ...]
    ) -> Dict[str, str]:
        """Every field of ``config_class`` that is neither honoured nor package-owned, with its reason."""
        try:
            fields = config_fields(config_class)
        except KeyError:
            # the table predates this config (python -m posttrain.components.generate rewrites it)
            return {}
        owned = OnlineSpec.owned_keys
        refused = {}
        for key in sorted(set(fields) - honoured - set(owned)):
            matching = (why for patterns, why in rules if any(fnmatch.fnmatchcase(key, p) for p in patterns))
            reason = next(matching, None)
            if reason is None:
                near = difflib.get_close_matches(key, sorted(honoured), n=3, cutoff=0.6)
                reason = "posttrain's PPO trainer does not use it" + (f"; it honours {', '.join(near)}" if near else "")
            refused[key] = reason
        return refused

    refused_keys: ClassVar[Dict[str, str]] = _refusals(config_class, honoured_keys, refusal_reasons)
    del _refusals
    refused_sections: ClassVar[Dict[str, str]] = {
        "model.lora": "posttrain's PPO trains full weights",
        "model.quantization": "posttrain's PPO trains full weights",
        "distributed.deepspeed": "posttrain's PPO runs on DDP",
        "distributed.fsdp": "posttrain's PPO runs on DDP",
        "data.eval": "PPO does not evaluate; its logs score every rollout",
    }

    def extra_model_paths(self) -> Dict[str, Optional[str]]:
        """The critic starts from ``value_model``, else the one reward model, which knows what good looks like (the
        usual start), else the policy's weights (a fresh score head)."""
        reward_models = [reward.model for reward in self.rewards if reward.model is not None]
        value = self.value_model or (reward_models[0] if len(reward_models) == 1 else self.model.name_or_path)
        return {**super().extra_model_paths(), "value_model": value}

    def problems(self, world_size: Optional[int]) -> List[str]:
        found = super().problems(world_size)
        training = self.training
        for key, refused in self.refused_values.items():
            value = training.get(key)
            if isinstance(value, str) and value in refused:
                found.append(f"training.{key}: {value!r} is not supported by posttrain.ppo; {refused[value]}")
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
    for cls in (
        SFTSpec,
        DPOSpec,
        RewardSpec,
        KTOSpec,
        ORPOSpec,
        GRPOSpec,
        RLOOSpec,
        PPOSpec,
        DistillSpec,
        OnlineDPOSpec,
    )
}
