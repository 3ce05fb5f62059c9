"""The spec's whole document, :class:`Spec`, and the keys of TRL's configs posttrain owns or refuses.

One pydantic model per section (``model``, ``data``, ``distributed``,
``rewards``: ``sections.py``; ``generation``: ``generation.py``;
``evaluate``: ``judging.py``); :class:`Spec` holds them, and its class-level
attributes describe what an algorithm *is* (its TRL config, the data it
reads, whether it generates, the keys it refuses). Each algorithm fills them
in once, in ``registry.py``, on its family's class (``families.py``).
"""

import difflib
import json
import typing
from typing import Any, ClassVar, Dict, List, Optional, Tuple

from posttrain.components.spec.data_sources import seed_overlaps
from posttrain.components.spec.fields import config_fields, config_value
from posttrain.components.spec.generation import runs_vllm_server
from posttrain.components.spec.judging import EvaluateSection
from posttrain.components.spec.messages import cut
from posttrain.components.spec.sections import (
    AgentSection,
    DataSpec,
    DistributedSpec,
    ModelSpec,
    Strict,
    taskset_problems,
)
from posttrain.components.spec.values import least_per_device_batch

# Keys of TRL's config classes that posttrain owns (sets itself) for every algorithm: where to go instead.
OWNED_KEYS: Dict[str, str] = {
    "deepspeed": "use distributed.deepspeed",
    "fsdp": "use distributed.fsdp",
    "fsdp_config": "use distributed.fsdp",
    "use_cpu": "posttrain sets it from the hardware",
    "local_rank": "the launcher sets it",
    "ddp_backend": "posttrain picks it (gloo on CPU, nccl on GPU)",
    "ddp_timeout": "use distributed.timeout_s",
    "resume_from_checkpoint": "use resume (auto, never, or a checkpoint path)",
    # transformers 4's field, which transformers 5 dropped: posttrain's own key now, beside resume
    "overwrite_output_dir": "use overwrite_output_dir at the top level of the spec",
    "hub_token": "it is a secret: set the HF_TOKEN environment variable",
    # posttrain loads every model itself, so TRL never reads these
    "model_init_kwargs": "posttrain loads the models: use model (dtype, attn_implementation, revision)",
    "trust_remote_code": "use model.trust_remote_code",
}


# TrainingArguments' keys no algorithm takes through posttrain, with the reason
REFUSED_KEYS: Dict[str, str] = {
    "parallelism_config": "accelerate's ParallelismConfig (context and tensor parallelism) is not what posttrain's "
    "sharding sets up, and it would pass unchecked: shard with distributed.fsdp or distributed.deepspeed",
}


# posttrain's own attention implementation (entrypoints/speed/attention.py): torch's varlen kernels, for training only
TORCH_VARLEN = "torch_varlen"
# Attention implementations that keep packed sequences apart given restarting position ids: eager, SDPA and flex
# through the mask transformers builds from them (masking_utils.find_packed_sequence_indices), flash attention
# and torch_varlen through the sequence boundaries TRL's collator passes (cu_seq_lens) or the positions.
PACKING_AWARE_ATTENTION = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", TORCH_VARLEN)
# activation checkpointing's switch and its options, each by its name in transformers 5 and by its old one
CHECKPOINTING_SWITCHES = ("activation_checkpointing", "gradient_checkpointing")
CHECKPOINTING_OPTIONS = ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs")


# TRL's trainers that fuse the LM head with the loss themselves: they refuse Liger's fused linear cross-entropy
FUSED_LM_HEAD_TRAINERS = ("trl:SFTTrainer", "trl:DPOTrainer", "trl:KTOTrainer", "trl:GRPOTrainer", "trl:RLOOTrainer")


class Spec(Strict):
    """Sections shared by every algorithm; each algorithm's subclass (registry.py) says what it is.

    The class-level attributes are the registry: import paths are strings,
    so the client never imports trl. Everything else (the field tables, the
    job's data checks, padding side, reward and extra-model loading) is
    derived from them.
    """

    algorithm: str
    model: ModelSpec
    data: DataSpec
    training: Dict[str, Any]
    distributed: DistributedSpec = DistributedSpec()
    # the trained model evaluated in the same job, once saved
    evaluate: Optional[EvaluateSection] = None
    resume: str = "auto"
    # the run may write over the model output_dir holds: another spec's, one posttrain did not write, or this spec's
    # finished one (trained again); checkpoints stay as resume says (entrypoints/records/checkpoints.py)
    overwrite_output_dir: bool = False

    # the class ``training`` is handed to, "module:Class"
    config_class: ClassVar[str]
    # the transformers auto class the trained model is loaded with
    model_class: ClassVar[str] = "AutoModelForCausalLM"
    # column sets the training data may have (any one of them), after data.columns renames
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]]
    # samples completions during training: prompts are padded on the left, the batch is checked, never shrunk
    generates: ClassVar[bool] = False
    # compares num_generations completions of each prompt (GRPO, RLOO)
    groups: ClassVar[bool] = False
    # its trainer generates with SDPA where the model trains with torch_varlen (entrypoints/speed/rl_padding_free.py)
    generates_with_sdpa: ClassVar[bool] = False
    # TRL's tokenised rows hold input_ids, which transformers' length-grouping samplers measure (SFT's do)
    rows_hold_input_ids: ClassVar[bool] = False
    # PEFT task type of the trained model under model.lora
    lora_task: ClassVar[str] = "CAUSAL_LM"
    # models besides the policy, by the spec field naming each: checked at submit, loaded by the entrypoint
    extra_models: ClassVar[Tuple[str, ...]] = ()
    # One vocabulary for the training keys a user may not set, one table of each per algorithm:
    # owned: posttrain sets the key itself (the message says where to go instead);
    owned_keys: ClassVar[Dict[str, str]] = OWNED_KEYS
    # refused: a field of the config class the trainer does not honour, with the reason (never ignored);
    refused_keys: ClassVar[Dict[str, str]] = REFUSED_KEYS
    # sections of the spec the algorithm refuses (model.lora, data.eval, distributed.fsdp, ...), with the reason
    refused_sections: ClassVar[Dict[str, str]] = {}
    # and values of honoured keys refused, by key, with the reason
    refused_values: ClassVar[Dict[str, Dict[str, str]]] = {}
    # the job's fast paths this algorithm takes where the user leaves their keys unset (entrypoints/speed/fast_paths.py)
    fast_paths: ClassVar[Tuple[str, ...]] = ()
    # with vllm_mode: server (and no server of the spec's own) the job gets a vllm role, placed by the component's
    # --vllm_* arguments (components/vllm_role.py); where False, server mode is refused at submit
    vllm_role: ClassVar[bool] = False
    # where TRL builds vLLM for it: the module (which imports LLM by name), the class that owns the engine, and
    # its weight-sync method, which the job adapts (entrypoints/generation/vllm_generation.py)
    vllm_owner: ClassVar[Optional[Tuple[str, str, str]]] = None
    # TRL's server mode asks torch for an accelerator in its trainer (refused on CPU)
    vllm_server_needs_gpus: ClassVar[bool] = False
    # transformers counts the tokens trained on from the batches' input_ids; where they hold none (prompts to
    # generate from, a collator's chosen and rejected pairs) it cannot, and warns at every step on every rank
    batches_hold_input_ids: ClassVar[bool] = True
    # TRL config values its trainer needs where the user leaves them unset
    config_defaults: ClassVar[Dict[str, Any]] = {}

    @classmethod
    def trainer_name(cls) -> str:
        """The trainer, "module:Class", as messages name it: each config class ``XConfig`` goes with ``XTrainer``."""
        return cls.config_class.replace("Config", "Trainer")

    @classmethod
    def name(cls) -> str:
        """The algorithm's name: its ``algorithm`` literal (``sft``, ``dpo``, ...)."""
        return typing.get_args(cls.model_fields["algorithm"].annotation)[0]

    @property
    def keeps_only_prompts(self) -> bool:
        """Whether the trainer drops every column of a row but its prompt and images (a reward reading another
        finds it gone)."""
        return False

    @property
    def min_per_device_batch(self) -> int:
        """The fewest examples per device and step the trainer accepts (the job never shrinks a batch below it)."""
        return least_per_device_batch(self.config_class, self.training)

    def named_models(self) -> List[Tuple[str, str]]:
        """Each model the spec names, by where it names it (``model.name_or_path``, ``reference_model``,
        ``rewards.0.model``, ...); defaults it leaves to the job are not named."""
        named = [("model.name_or_path", self.model.name_or_path)]
        named += [(field, getattr(self, field)) for field in self.extra_models]
        named += [(f"rewards.{index}.model", reward.model) for index, reward in enumerate(getattr(self, "rewards", []))]
        return [(where, name) for where, name in named if isinstance(name, str)]

    def extra_model_paths(self) -> Dict[str, Optional[str]]:
        """Each extra model's path or hub id, defaults applied; None where there is none to load. The reference
        defaults to a second load of the policy, and under LoRA is none: the trainer turns the adapter off."""
        paths = {field: getattr(self, field) for field in self.extra_models}
        if "reference_model" in paths:
            paths["reference_model"] = (
                None if self.model.lora is not None else self.reference_model or self.model.name_or_path
            )
        return paths

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace. ``from_json`` inverts it."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def evaluation_section(self) -> EvaluateSection:
        """The ``evaluate:`` section as the job runs it: a model trained with tools, an environment or an agent program
        is judged with them, and with its rounds of calls, where the section names none of its own."""
        assert self.evaluate is not None
        if not isinstance(self, AgentSection) or not self.is_agentic() or self.evaluate.is_agentic():
            return self.evaluate
        # benchmarks alone: no held-out prompts to play episodes of
        if self.evaluate.data is None:
            return self.evaluate
        generation = self.evaluate.generation
        if generation.max_tool_calling_iterations is None:
            rounds = self.training.get("max_tool_calling_iterations")
            generation = generation.model_copy(update={"max_tool_calling_iterations": rounds})
        return self.evaluate.model_copy(
            update={"tools": self.tools, "environment": self.environment, "agent": self.agent, "generation": generation}
        )

    def problems(self, world_size: Optional[int]) -> List[str]:
        """Checks across fields; subclasses add their own."""
        found = []
        training = self.training
        if training.get("bf16") and training.get("fp16"):
            found.append("training.bf16, training.fp16: at most one can be true")
        dtype = self.model.dtype
        if dtype == "float16" and training.get("bf16"):
            found.append("model.dtype: float16 contradicts training.bf16: true; use model.dtype bfloat16 or auto")
        if dtype == "bfloat16" and training.get("fp16"):
            found.append("model.dtype: bfloat16 contradicts training.fp16: true; use model.dtype float16 or auto")
        found += self.data.problems()
        found += taskset_problems(
            getattr(self, "environment", None), self.data.sources("train") + self.data.sources("eval")
        )
        if self.resume not in ("auto", "never") and not self.resume.strip():
            found.append("resume: expected auto, never or a checkpoint path; got an empty string")
        elif self.resume not in ("auto", "never") and "/" not in self.resume:
            close = difflib.get_close_matches(self.resume, ["auto", "never"], n=1, cutoff=0.5)
            # the job would look for a checkpoint directory of that name
            if close:
                found.append(f"resume: {cut(repr(self.resume))} is neither auto nor never; did you mean {close[0]}?")
        found += self.distributed.problems()
        found += self._quantization_problems()
        if self.evaluate is not None and self.model_class != "AutoModelForCausalLM":
            found.append(
                f"evaluate: posttrain.{self.name()} trains a {self.model_class.removeprefix('AutoModelFor')} model, "
                "which an evaluation cannot sample from; evaluate a policy it scores (rewards: [{model: ...}])"
            )
        elif self.evaluate is not None:
            found += self.evaluation_section().problems()
            if self.evaluate.data is not None:
                held_out = [(f"evaluate.{where}", source) for where, source in self.evaluate.data.sources("eval")]
                found += seed_overlaps(self.data.sources("train"), held_out)
        for key, why in self.refused_sections.items():
            section, _, name = key.partition(".")
            if getattr(getattr(self, section), name) is not None:
                found.append(f"{key}: {why}; remove {key}")
        if runs_vllm_server(training) and not self.vllm_role:
            found.append(
                f"training.vllm_mode: server needs the job's vllm role beside the trainers, which posttrain.{self.name()} "
                "does not run; use vllm_mode: colocate, or a server of your own (vllm_server_base_url)"
            )
        if not isinstance(training.get("output_dir"), str) or not training["output_dir"].strip():
            # an empty or null one would make the job write into its working directory, the checkout
            got = "" if "output_dir" not in training else f"; got {cut(repr(training['output_dir']))}"
            found.append(
                f"training.output_dir: required; the directory the job writes the model and checkpoints to{got}"
            )
        if not self.model.name_or_path.strip():
            found.append("model.name_or_path: expected a path, a hub id or builtin:tiny-llama; got an empty string")
        for key in ("reference_model", "teacher_model", "value_model"):
            if isinstance(getattr(self, key, None), str) and not getattr(self, key).strip():
                found.append(f"{key}: expected a path or hub id; got an empty string (remove it for the default)")
        packed = [key for key in ("packing", "padding_free") if training.get(key) is True]
        attention = self.model.attn_implementation
        if packed and attention is not None and attention not in PACKING_AWARE_ATTENTION:
            found.append(
                f"training.{packed[0]}: with model.attn_implementation {attention!r} packed sequences could attend "
                f"to each other; use one of {', '.join(PACKING_AWARE_ATTENTION)}, or set it to false"
            )
        if attention == TORCH_VARLEN and self.generates and not self.generates_with_sdpa:
            found.append(
                f"model.attn_implementation: {TORCH_VARLEN} trains on whole sequences and cannot generate with "
                f"a KV cache, which posttrain.{self.name()} does; use sdpa or flash_attention_2"
            )
        max_steps = training.get("max_steps")
        if isinstance(max_steps, int) and (max_steps == 0 or max_steps < -1):
            found.append(f"training.max_steps: must be positive, or -1 to train by epochs; got {max_steps}")
        found += self._trainer_problems()
        return found

    def _quantization_problems(self) -> List[str]:
        """What ``model.quantization`` needs of the other sections (an algorithm that refuses it says so itself)."""
        if self.model.quantization is None or "model.quantization" in self.refused_sections:
            return []
        found = []
        if self.model.lora is None:
            found.append(
                f"model.quantization: {self.model.quantization} weights are frozen; add model.lora to train an "
                "adapter on them (QLoRA), or drop model.quantization to train every weight"
            )
        if self.distributed.sharding is not None:
            strategy = self.distributed.strategy
            found.append(
                f"model.quantization: posttrain does not shard quantized weights with distributed.{strategy}; train "
                f"QLoRA with data parallelism (drop distributed.{strategy}), or drop model.quantization"
            )
        return found

    def _trainer_problems(self) -> List[str]:
        """Settings the trainer refuses only once the models are loaded, or leaves unused (``data.eval``), across
        ``training`` and other sections.

        The ones within ``training`` alone are rows of the value table (``requires``, ``unused``).
        """
        found, training, refused = [], self.training, self.refused_keys
        if "eval_strategy" in config_fields(self.config_class) and "eval_strategy" not in refused:
            evaluation = config_value(self.config_class, training, "eval_strategy")
            if evaluation not in (None, "no") and self.data.eval is None:
                found.append(
                    f"training.eval_strategy: {evaluation} evaluates on data.eval, which the spec does not "
                    "give; add data.eval, or set eval_strategy: no"
                )
            if evaluation == "no" and self.data.eval is not None and training.get("eval_on_start") is not True:
                given = "" if "eval_strategy" in training else " (TRL's default)"
                found.append(
                    f"data.eval: the trainer never evaluates with eval_strategy: no{given}; set "
                    "eval_strategy: steps (every eval_steps) or epoch, or eval_on_start: true, or drop "
                    "data.eval"
                )
        if training.get("eval_on_start") is True and self.data.eval is None and "eval_on_start" not in refused:
            found.append(
                "training.eval_on_start: true evaluates on data.eval before training, which the spec does "
                "not give; add data.eval, or drop eval_on_start"
            )
        if self.model.lora is not None and training.get("sync_ref_model") is True:
            found.append(
                "training.sync_ref_model: with model.lora the reference is the policy without its adapter, "
                "so there is no reference model to sync; remove it, or train without LoRA"
            )
        if training.get("save_strategy") == "best" and training.get("metric_for_best_model") is None:
            found.append(
                "training.save_strategy: best keeps the checkpoint with the best metric_for_best_model, "
                "which is unset; set it (e.g. eval_loss)"
            )
        found += self.distributed.training_problems(training)
        # SFT: on by default on GPUs
        liger = training.get("use_liger_kernel", "use_liger_kernel" in self.fast_paths)
        options = training.get("liger_kernel_config")
        fused = isinstance(options, dict) and options.get("fused_linear_cross_entropy")
        if fused and liger is True and self.trainer_name() in FUSED_LM_HEAD_TRAINERS:
            default = "" if "use_liger_kernel" in training else " (on by default on GPUs)"
            found.append(
                "training.liger_kernel_config: fused_linear_cross_entropy: true cannot go with Liger kernels"
                f"{default} in {self.trainer_name()}, which fuses the LM head with the loss itself; drop it"
            )
        return found
