"""The spec's schema: the sections every algorithm shares, and the families algorithms belong to.

One pydantic model per section (``model``, ``data``, ``distributed``,
``rewards``); :class:`Spec` is the whole document, and its class-level
attributes describe what an algorithm *is* (its TRL config, the data it
reads, whether it generates, the keys it refuses). Each algorithm fills them in once, in
``registry.py``.
"""

import difflib
import json
import re
import typing
from typing import Any, ClassVar, Dict, List, Literal, Optional, Sequence, Tuple, Union

from pydantic import BaseModel, ConfigDict

from posttrain.components.spec import conditions
from posttrain.components.spec.data_sources import data_problems
from posttrain.components.spec.fields import config_fields, config_value
from posttrain.components.spec.messages import cut
from posttrain.components.spec.rewards import check_builtin
from posttrain.components.spec.values import generation_batch_problems, least_per_device_batch

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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


# the data formats of algorithms that read prompts alone (GRPO's, an evaluation's): the model writes the rest
PROMPT_FORMATS: Tuple[Tuple[str, ...], ...] = (("prompt",),)
# posttrain's own attention implementation (entrypoints/speed/attention.py): torch's varlen kernels, for training only
TORCH_VARLEN = "torch_varlen"
# Attention implementations that keep packed sequences apart given restarting position ids: eager, SDPA and flex
# through the mask transformers builds from them (masking_utils.find_packed_sequence_indices), flash attention
# and torch_varlen through the sequence boundaries TRL's collator passes (cu_seq_lens) or the positions.
PACKING_AWARE_ATTENTION = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", TORCH_VARLEN)
# activation checkpointing's switch and its options, each by its name in transformers 5 and by its old one
CHECKPOINTING_SWITCHES = ("activation_checkpointing", "gradient_checkpointing")
CHECKPOINTING_OPTIONS = ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs")
# where a job with vllm_mode: server finds its vllm role's host: the component sets it from the scheduler's host
# variables (components/vllm_role.py), the trainers and the role read it (entrypoints/generation/)
VLLM_HOST_VARIABLE = "POSTTRAIN_VLLM_HOST"
# the job's secret between its trainers and its vllm role (entrypoints/generation/vllm_token.py): the component
# makes one for the job in the submitting environment, which local_cwd and Slurm jobs inherit; elsewhere a file the
# job can read
VLLM_TOKEN_VARIABLE = "POSTTRAIN_VLLM_TOKEN"
VLLM_TOKEN_PATH_VARIABLE = "POSTTRAIN_VLLM_TOKEN_PATH"


def runs_vllm_server(training: Dict[str, Any]) -> bool:
    """Whether ``training`` asks for a vLLM server the job runs: server mode, and no server of its own."""
    return (
        bool(training.get("use_vllm"))
        and training.get("vllm_mode", "colocate") == "server"
        and not training.get("vllm_server_base_url")
        and "vllm_server_host" not in training
    )


# TRL's trainers that fuse the LM head with the loss themselves: they refuse Liger's fused linear cross-entropy
FUSED_LM_HEAD_TRAINERS = ("trl:SFTTrainer", "trl:DPOTrainer", "trl:KTOTrainer", "trl:GRPOTrainer", "trl:RLOOTrainer")


class ModelSpec(_Strict):
    """The model to train: a local path, a hub id, or ``builtin:tiny-llama``."""

    name_or_path: str
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    attn_implementation: Optional[str] = None
    trust_remote_code: bool = False
    revision: Optional[str] = None
    lora: Optional[Dict[str, Any]] = None
    # the trained model's frozen weights in 4 bits as they load (QLoRA), its LoRA adapter in 16 or 32
    quantization: Optional[Literal["4bit"]] = None


class DataSource(_Strict):
    """One data source: a local file, a glob of files or a saved data set (``path``), or a hub data set (``name``);
    its own column renames (beside ``data.columns``), a cap on its rows, and its weight in an interleaved mixture."""

    path: Optional[str] = None
    name: Optional[str] = None
    config: Optional[str] = None
    split: str = "train"
    columns: Dict[str, str] = {}
    max_rows: Optional[int] = None
    weight: Optional[float] = None


class ChatPrompts(_Strict):
    """Text prompts as chat messages: the system message, if any, then the prompt as the user's."""

    system: Optional[str] = None


class DataSpec(_Strict):
    """Training and evaluation data, each one source or a list of them (a mixture: ``mix``); ``columns`` renames
    ``{found: expected}`` in every source; ``chat`` makes text prompts chat messages."""

    train: Union[DataSource, List[DataSource]]
    eval: Union[DataSource, List[DataSource], None] = None
    columns: Dict[str, str] = {}
    mix: Literal["concatenate", "interleave"] = "concatenate"
    chat: Optional[ChatPrompts] = None

    def sources(self, split: str) -> List[Tuple[str, DataSource]]:
        """``data.train`` or ``data.eval`` as ``(dotted key, source)`` pairs: ``data.train``, or ``data.train.0``,
        ``data.train.1``, ... for a list."""
        given = getattr(self, split)
        if given is None:
            return []
        if isinstance(given, DataSource):
            return [(f"data.{split}", given)]
        return [(f"data.{split}.{index}", source) for index, source in enumerate(given)]

    def problems(self) -> List[str]:
        return data_problems(self)


# how long one call of the user's code (a reward function, a tool, an environment's method) may take where the spec
# sets no timeout_s: past it the job ends in one line naming the function (entrypoints/inputs/user_code.py)
USER_CODE_TIMEOUT_S = 600.0


def timeout_problems(where: str, timeout_s: Optional[float]) -> List[str]:
    """A user function's ``timeout_s``: seconds above 0, or unset (:data:`USER_CODE_TIMEOUT_S`)."""
    if timeout_s is None or timeout_s > 0:
        return []
    return [f"{where}.timeout_s: expected seconds above 0 (unset: {USER_CODE_TIMEOUT_S:g}); got {timeout_s:g}"]


class RewardSource(_Strict):
    """One reward: exactly one of a user callable, a built-in, or a reward model; weighted."""

    # "module:callable", importable in the job
    function: Optional[str] = None
    builtin: Optional[str] = None
    # a sequence-classification model: path or hub id
    model: Optional[str] = None
    args: Dict[str, Any] = {}
    weight: float = 1.0
    # how long one call of the function may take (None: USER_CODE_TIMEOUT_S)
    timeout_s: Optional[float] = None

    def problems(self, where: str) -> List[str]:
        given = [key for key in ("function", "builtin", "model") if getattr(self, key) is not None]
        if len(given) != 1:
            return [f"{where}: give exactly one of function (module:callable), builtin (a name) or model (a path)"]
        if self.model is not None and not self.model.strip():
            return [f"{where}.model: expected a path or hub id of a reward model; got an empty string"]
        if self.function is not None:
            problem = import_path_problem(
                f"{where}.function", self.function, "module:callable (e.g. my_rewards:accuracy)"
            )
            if problem is not None:
                return [problem]
        if self.timeout_s is not None and self.function is None:
            what = (
                "a built-in bounds its own work (code_tests: args.timeout_s)" if self.builtin else "a model's does not"
            )
            return [f"{where}.timeout_s: bounds a function's call, and {what}; drop it"]
        if self.builtin is not None:
            return [f"{where}.builtin: {problem}" for problem in check_builtin(self.builtin, self.args)]
        if self.args:
            return [f"{where}.args: only built-in rewards take args"]
        return timeout_problems(where, self.timeout_s)


class EvalData(DataSpec):
    """The prompts to evaluate on: ``data.eval`` (one source or a mixture), with the sections' usual renames."""

    train: None = None
    eval: Union[DataSource, List[DataSource]]


class GenerationSpec(_Strict):
    """How each model samples: ``num_samples`` completions per prompt of up to ``max_new_tokens``; temperature 0
    is greedy. Only these settings: nothing is taken from a model's own generation config but its end token."""

    num_samples: int = 1
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    # auto: vLLM where the job's environment has it (a process of its own per model), else transformers' generate
    engine: Literal["auto", "transformers", "vllm"] = "auto"
    # vLLM's share of the device's memory (on CPU, of the machine's)
    vllm_gpu_memory_utilization: float = 0.3
    # how long vLLM's sampling of one model (a rank's prompts, in a process of its own, its engine's start included)
    # may take
    vllm_timeout_s: float = 3600.0

    def problems(self) -> List[str]:
        found = []
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            found.append(
                f"generation.vllm_gpu_memory_utilization: expected a share in (0, 1]; got "
                f"{self.vllm_gpu_memory_utilization}"
            )
        if self.vllm_timeout_s <= 0:
            found.append(f"generation.vllm_timeout_s: expected seconds above 0; got {self.vllm_timeout_s:g}")
        if self.num_samples < 1:
            found.append(f"generation.num_samples: expected 1 or more; got {self.num_samples}")
        if self.max_new_tokens < 1:
            found.append(f"generation.max_new_tokens: expected 1 or more; got {self.max_new_tokens}")
        if self.temperature < 0:
            found.append(f"generation.temperature: expected 0 (greedy) or more; got {self.temperature}")
        if not 0 < self.top_p <= 1:
            found.append(f"generation.top_p: expected a value in (0, 1]; got {self.top_p}")
        elif self.temperature == 0 and self.top_p != 1:
            found.append(f"generation.top_p: {self.top_p} does nothing when greedy (temperature 0); drop it")
        if not 0 <= self.seed < 2**32:
            found.append(f"generation.seed: expected 0 to 2**32 - 1; got {self.seed}")
        if self.temperature == 0 and self.num_samples > 1:
            found.append(
                f"generation.num_samples: {self.num_samples} greedy samples are one sample repeated; set a "
                "temperature above 0, or num_samples: 1"
            )
        return found


class TrainingGeneration(_Strict):
    """How the trainers and the ``vllm`` role take turns: lockstep (``max_lag: 0``, TRL's own: the trainers push
    their weights, then wait for the samples), or the role generating the next batches while the trainers train,
    its samples at most ``max_lag`` policy versions (optimizer steps) old (entrypoints/generation/run_ahead.py)."""

    max_lag: int = 0
    # with max_lag above 0: optimizer steps between two pushes of the weights to the role
    weight_sync_steps: int = 1
    # how long one push of the weights may take before the job ends, in one line
    weight_sync_timeout_s: float = 600.0
    # how long vLLM's generation of one step's samples may take before the job ends, in one line (None: 9/10 of
    # distributed.timeout_s, which the other processes wait for the samples)
    generate_timeout_s: Optional[float] = None

    @property
    def runs_ahead(self) -> bool:
        return self.max_lag > 0

    def generate_timeout(self, collective_timeout_s: float) -> float:
        """``generate_timeout_s``, or where unset 9/10 of the collectives' timeout: the other processes' wait for the
        samples ends there, and the job's line should be the generation's."""
        return self.generate_timeout_s if self.generate_timeout_s is not None else 0.9 * collective_timeout_s

    def problems(self) -> List[str]:
        found = []
        if self.generate_timeout_s is not None and self.generate_timeout_s <= 0:
            found.append(
                f"generation.generate_timeout_s: expected seconds above 0 (unset: 9/10 of distributed.timeout_s); "
                f"got {self.generate_timeout_s:g}"
            )
        if self.max_lag < 0:
            found.append(f"generation.max_lag: expected 0 (lockstep) or more; got {self.max_lag}")
        if self.weight_sync_timeout_s <= 0:
            found.append(
                f"generation.weight_sync_timeout_s: expected seconds above 0; got {self.weight_sync_timeout_s:g}"
            )
        if self.weight_sync_steps < 1:
            found.append(f"generation.weight_sync_steps: expected 1 or more; got {self.weight_sync_steps}")
        elif self.max_lag == 0 and self.weight_sync_steps != 1:
            found.append(
                f"generation.weight_sync_steps: {self.weight_sync_steps} with max_lag: 0 (lockstep), which pushes "
                "the weights before every generation; drop it, or let samples lag (max_lag: "
                f"{self.weight_sync_steps - 1} or more)"
            )
        elif self.max_lag > 0 and self.weight_sync_steps > self.max_lag + 1:
            found.append(
                f"generation.weight_sync_steps: {self.weight_sync_steps} steps between pushes would leave samples "
                f"older than max_lag: {self.max_lag} allows; use at most {self.max_lag + 1}, or raise max_lag"
            )
        return found


class BenchmarksSpec(_Strict):
    """Standard benchmarks, run on each model by EleutherAI's lm-evaluation-harness (``pip install
    'posttrain[lm-eval]'``) with the harness's own task definitions, or the user's (``include_path``)."""

    tasks: List[str]
    # a folder of the user's own task YAMLs (a task from a local file)
    include_path: Optional[str] = None
    num_fewshot: Optional[int] = None
    # each task's first examples only
    limit: Optional[int] = None
    batch_size: int = 8
    apply_chat_template: bool = False

    def problems(self) -> List[str]:
        found = [] if self.tasks else ["benchmarks.tasks: name at least one task (e.g. gsm8k, arc_easy)"]
        found += [
            f"benchmarks.tasks.{index}: expected a task name; got {cut(repr(task))}"
            for index, task in enumerate(self.tasks)
            if not re.fullmatch(r"[A-Za-z0-9_][\w.-]*", task)
        ]
        if self.include_path is not None and not self.include_path.strip():
            found.append("benchmarks.include_path: expected a folder of task YAMLs; got an empty string")
        if self.num_fewshot is not None and self.num_fewshot < 0:
            found.append(f"benchmarks.num_fewshot: expected 0 or more; got {self.num_fewshot}")
        if self.limit is not None and self.limit < 1:
            found.append(f"benchmarks.limit: expected 1 or more; got {self.limit}")
        if self.batch_size < 1:
            found.append(f"benchmarks.batch_size: expected 1 or more; got {self.batch_size}")
        return found


class Evaluation(_Strict):
    """What an evaluation samples and scores: held-out prompts, the scorers (GRPO's rewards vocabulary), how
    each model samples, pass@k's k and the conditions the scores must meet. ``posttrain.eval``'s spec
    (evaluation.py) and a training spec's ``evaluate:`` section are each one."""

    # held-out prompts the models complete and the scorers score; or only benchmarks, or both
    data: Optional[EvalData] = None
    rewards: List[RewardSource] = []
    benchmarks: Optional[BenchmarksSpec] = None
    generation: GenerationSpec = GenerationSpec()
    # k of pass@k: the chance that at least one of k samples passes (scores 1), from the num_samples drawn
    pass_at_k: List[int] = [1]
    # what the scores must show for the job to succeed (conditions.py)
    require: List[str] = []

    # a prompt column, as GRPO's data
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PROMPT_FORMATS

    def scorer_names(self) -> List[str]:
        """Each scorer's name in the summary: its built-in's or function's name, numbered where two share one."""
        # a function's own name (my_scores:Judge.correct: correct), a reward model's folder's (outputs/reward-tiny:
        # reward_tiny), as require's conditions can write them
        names = [
            reward.builtin
            or (reward.function or "").rpartition(":")[2].rpartition(".")[2]
            or re.sub(r"\W", "_", str(reward.model).rstrip("/").rpartition("/")[2])
            for reward in self.rewards
        ]
        return [f"{name}_{index}" if names.count(name) > 1 else name for index, name in enumerate(names)]

    def evaluation_problems(self, models: Sequence[str]) -> List[str]:
        """What is wrong with the scorers, the generation settings, pass@k and ``require`` (naming ``models``),
        and the data."""
        found = []
        if self.data is None and self.benchmarks is None:
            found.append(
                "data.eval: give held-out prompts (data.eval) and scorers (rewards), or benchmarks (tasks of "
                "lm-evaluation-harness), or both"
            )
        elif self.data is not None and not self.rewards:
            found.append("rewards: name at least one scorer (e.g. - builtin: contains, args: {column: answer})")
        elif self.data is None and self.rewards:
            found.append("data.eval: the scorers (rewards) score completions of held-out prompts; give them there")
        names = self.scorer_names()
        for index, reward in enumerate(self.rewards):
            found += reward.problems(f"rewards.{index}")
            if names.count(names[index]) > 1:
                found.append(
                    f"rewards.{index}: its name in the summary, {names[index]}, is another scorer's too; give the "
                    "function another name"
                )
            if reward.weight != 1.0:
                found.append(f"rewards.{index}.weight: an evaluation reports each scorer apart, unweighted; drop it")
        found += self.generation.problems()
        for k in self.pass_at_k:
            if not 1 <= k <= self.generation.num_samples:
                found.append(
                    f"pass_at_k: {k} needs at least {k} samples per prompt; expected 1 to generation.num_samples "
                    f"({self.generation.num_samples})"
                )
        tasks = self.benchmarks.tasks if self.benchmarks is not None else []
        found += [
            f"benchmarks.tasks: {task} is also a scorer's name; a condition could not tell them apart"
            for task in tasks
            if task in names
        ]
        found += self.benchmarks.problems() if self.benchmarks is not None else []
        found += conditions.problems(self.require, models, names, self.pass_at_k, tasks)
        return found + (self.data.problems() if self.data is not None else [])


class EvaluateSection(Evaluation):
    """A training spec's ``evaluate:``: once the model is saved, the same job evaluates it as ``after`` (and with
    ``before: true`` the model it started from as ``before``), as ``posttrain.eval`` would, into
    ``<output_dir>/eval``; the results go into ``run_summary.json`` and the run's closing line."""

    before: bool = False

    def model_names(self) -> List[str]:
        """The evaluated models' names, the baseline first (``require:`` names them)."""
        return ["before", "after"] if self.before else ["after"]

    def problems(self) -> List[str]:
        return [f"evaluate.{problem}" for problem in self.evaluation_problems(self.model_names())]


class DeepSpeedSpec(_Strict):
    """DeepSpeed ZeRO: a stage with optional CPU offload, or the path of your own DeepSpeed JSON."""

    zero_stage: Optional[Literal[1, 2, 3]] = None
    offload_optimizer: bool = False
    offload_params: bool = False
    config: Optional[str] = None

    def problems(self) -> List[str]:
        found = []
        if (self.config is None) == (self.zero_stage is None):
            found.append(
                "distributed.deepspeed: give zero_stage (1, 2 or 3, with optional offload) or config "
                "(the path of a DeepSpeed JSON), not both or neither"
            )
        if self.config is not None and (self.offload_optimizer or self.offload_params):
            found.append("distributed.deepspeed: offload is set in your config file, not beside config")
        if self.offload_params and self.zero_stage != 3:
            found.append("distributed.deepspeed.offload_params: parameter offload needs zero_stage 3")
        return found

    def training_problems(self, training: Dict[str, Any]) -> List[str]:
        if self.zero_stage == 3 and training.get("auto_find_batch_size") is True:
            return [
                "training.auto_find_batch_size: transformers does not support it with ZeRO-3; remove it, "
                "or use zero_stage 1 or 2"
            ]
        return []

    def gpu_problems(self, no_gpu: str) -> List[str]:
        # DeepSpeed shards on CPU too
        return []


class FSDPSpec(_Strict):
    """FSDP2 through accelerate: every decoder layer sharded on its own, then the rest of the model.

    ``reshard_after_forward`` false keeps each layer's gathered parameters
    from the forward to the backward pass (more memory, fewer all-gathers,
    like ZeRO-2). ``wrap_layers`` names the layer classes to shard one by
    one; the default is the model's own (``_no_split_modules``: its decoder
    layers).
    """

    reshard_after_forward: bool = True
    cpu_offload: bool = False
    wrap_layers: Optional[List[str]] = None

    def problems(self) -> List[str]:
        if self.wrap_layers is not None and not self.wrap_layers:
            return ["distributed.fsdp.wrap_layers: an empty list shards nothing; remove it to wrap the decoder layers"]
        return []

    def training_problems(self, training: Dict[str, Any]) -> List[str]:
        if training.get("save_only_model") is True and training.get("load_best_model_at_end") is not True:
            return [
                "training.save_only_model: distributed.fsdp saves sharded checkpoints, the optimizer's state "
                "with the model's; remove it"
            ]
        return []

    def gpu_problems(self, no_gpu: str) -> List[str]:
        """Where the job has no GPU (``no_gpu`` says how it is known): accelerate would train plain DDP instead."""
        return [
            f"distributed.fsdp: {no_gpu}, and accelerate runs FSDP on GPUs only (on CPU it trains plain DDP "
            "instead); run on GPUs, or shard on CPU with distributed.deepspeed"
        ]


# Each sharding section says what its strategy refuses, of the hardware and of ``training``: the client asks it at
# submit, the job's strategy (entrypoints/job/sharding.py) before it starts
class DistributedSpec(_Strict):
    """How the job is distributed; ``timeout_s`` bounds every collective (every backend)."""

    timeout_s: int = 300
    deepspeed: Optional[DeepSpeedSpec] = None
    fsdp: Optional[FSDPSpec] = None

    @property
    def sharding(self) -> Optional[Union[DeepSpeedSpec, FSDPSpec]]:
        """The sharding section, or None for plain data parallelism."""
        return self.deepspeed or self.fsdp

    @property
    def strategy(self) -> str:
        """The strategy's name, as ``run_summary.json``'s engine says it (one process: ``single``, not ``ddp``)."""
        return "deepspeed" if self.deepspeed else "fsdp" if self.fsdp else "ddp"

    def problems(self) -> List[str]:
        found = []
        if self.timeout_s <= 0:
            found.append(f"distributed.timeout_s: must be positive; got {self.timeout_s}")
        if self.deepspeed is not None and self.fsdp is not None:
            found.append("distributed: deepspeed and fsdp both shard the model; choose one of them")
        for section in (self.deepspeed, self.fsdp):
            found += section.problems() if section is not None else []
        return found

    def training_problems(self, training: Dict[str, Any]) -> List[str]:
        """What the strategy refuses of ``training``."""
        if self.sharding is None:
            return []
        found = []
        if training.get("save_only_model") is True and training.get("load_best_model_at_end") is True:
            found.append(
                f"training.save_only_model: with distributed.{self.strategy} the best model cannot be "
                "loaded at the end from checkpoints without their sharded state; drop it or "
                "load_best_model_at_end"
            )
        return found + self.sharding.training_problems(training)

    def gpu_problems(self, no_gpu: str) -> List[str]:
        """What the strategy refuses where the job has no GPU; ``no_gpu`` says how that is known."""
        return self.sharding.gpu_problems(no_gpu) if self.sharding is not None else []


class Spec(_Strict):
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
            found += self.evaluate.problems()
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


class _ReferenceSpec(Spec):
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


def import_path_problem(where: str, path: str, expected: str) -> Optional[str]:
    """What is wrong with ``path`` as the import path of user code the job imports ("module:attr"), if anything."""
    if re.fullmatch(r"[\w.]+:[\w.]+", path):
        return None
    return f"{where}: expected {expected}; got {cut(repr(path))}"


class ToolSource(_Strict):
    """One tool the model may call while it generates: a user function, whose name, typed arguments and docstring
    are what the model sees of it."""

    # "module:function", importable in the job
    function: str
    # how long one call may take (None: USER_CODE_TIMEOUT_S)
    timeout_s: Optional[float] = None

    def problems(self, where: str) -> List[str]:
        problem = import_path_problem(f"{where}.function", self.function, "module:function (e.g. my_tools:lookup)")
        return ([problem] if problem is not None else []) + timeout_problems(where, self.timeout_s)


class EnvironmentSource(_Strict):
    """An environment the model acts in: a class built for each rollout (with ``args``), whose public methods are
    the model's tools, whose ``reset(**row)`` starts it (and may add to the prompt), and whose ``get_reward()`` may
    score the rollout."""

    # "module:Class", importable in the job
    factory: str
    args: Dict[str, Any] = {}
    # how long building it, or one call of a method, may take (None: USER_CODE_TIMEOUT_S)
    timeout_s: Optional[float] = None

    def problems(self, where: str) -> List[str]:
        problem = import_path_problem(f"{where}.factory", self.factory, "module:Class (e.g. my_env:Game)")
        return ([problem] if problem is not None else []) + timeout_problems(where, self.timeout_s)


class _OnlineSpec(Spec):
    """Algorithms that generate completions and score them with ``rewards``."""

    rewards: List[RewardSource]
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


class _GroupSpec(_OnlineSpec):
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
    fast_paths: ClassVar[Tuple[str, ...]] = ("padding_free", "micro_batches")
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
