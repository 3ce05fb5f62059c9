"""The spec: one validated YAML document describing a training run.

The client validates it (so ``--dryrun`` and submission fail before anything
is scheduled), embeds it in the job as canonical JSON, and the job validates
it again with the same models before loading any model. See DESIGN.md.

Every problem is reported with the key's dotted path, what was expected and,
for unknown keys, the nearest valid key::

    training.learnig_rate: unknown key; did you mean training.learning_rate?
"""

import difflib
import re
import typing
import json
from pathlib import Path
from typing import Any, ClassVar, Dict, Iterator, List, Literal, Mapping, Optional, Sequence, Tuple, Type

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from posttrain.components.fields import FieldType, config_fields, config_value, field_type


class SpecError(ValueError):
    """A spec, an override or a component argument is invalid.

    ``problems`` lists every problem found, one line each; ``str(error)`` is
    them joined by newlines.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


# Keys of TRL's config classes that the package sets itself: where to go instead.
PACKAGE_OWNED_TRAINING_KEYS: Dict[str, str] = {
    "deepspeed": "use distributed.deepspeed",
    "fsdp": "use distributed.fsdp",
    "fsdp_config": "use distributed.fsdp",
    "use_cpu": "posttrain sets it from the hardware",
    "local_rank": "the launcher sets it",
    "ddp_backend": "posttrain picks it (gloo on CPU, nccl on GPU)",
    "ddp_timeout": "use distributed.timeout_s",
    "resume_from_checkpoint": "use resume (auto, never, or a checkpoint path)",
    "hub_token": "it is a secret: set the HF_TOKEN environment variable",
}

# training keys whose values must be positive (where set and not null).
POSITIVE_TRAINING_KEYS = (
    "learning_rate",
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "max_length",
    "max_prompt_length",
    "max_completion_length",
    "logging_steps",
    "save_steps",
    "eval_steps",
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ModelSpec(_Strict):
    """The model to train: a local path, a hub id, or ``builtin:tiny-llama``."""

    name_or_path: str
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    attn_implementation: Optional[str] = None
    trust_remote_code: bool = False
    revision: Optional[str] = None
    lora: Optional[Dict[str, Any]] = None


class DataSource(_Strict):
    """A local JSON/JSONL/Parquet file (``path``) or a hub data set (``name``)."""

    path: Optional[str] = None
    name: Optional[str] = None
    config: Optional[str] = None
    split: str = "train"


class DataSpec(_Strict):
    """Training and evaluation data; ``columns`` renames ``{found: expected}``."""

    train: DataSource
    eval: Optional[DataSource] = None
    columns: Dict[str, str] = {}


class DeepSpeedSpec(_Strict):
    """DeepSpeed ZeRO: a stage with optional CPU offload, or the path of your own DeepSpeed JSON."""

    zero_stage: Optional[Literal[1, 2, 3]] = None
    offload_optimizer: bool = False
    offload_params: bool = False
    config: Optional[str] = None


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


class DistributedSpec(_Strict):
    """How the job is distributed; ``timeout_s`` bounds every collective (every backend)."""

    timeout_s: int = 300
    deepspeed: Optional[DeepSpeedSpec] = None
    fsdp: Optional[FSDPSpec] = None

    def problems(self) -> List[str]:
        found = []
        if self.timeout_s <= 0:
            found.append(f"distributed.timeout_s: must be positive; got {self.timeout_s}")
        if self.deepspeed is not None and self.fsdp is not None:
            found.append("distributed: deepspeed and fsdp both shard the model; choose one of them")
        if self.fsdp is not None and self.fsdp.wrap_layers is not None and not self.fsdp.wrap_layers:
            found.append("distributed.fsdp.wrap_layers: an empty list shards nothing; remove it to wrap the decoder layers")
        ds = self.deepspeed
        if ds is not None:
            if (ds.config is None) == (ds.zero_stage is None):
                found.append(
                    "distributed.deepspeed: give zero_stage (1, 2 or 3, with optional offload) or config "
                    "(the path of a DeepSpeed JSON), not both or neither"
                )
            if ds.config is not None and (ds.offload_optimizer or ds.offload_params):
                found.append("distributed.deepspeed: offload is set in your config file, not beside config")
            if ds.offload_params and ds.zero_stage != 3:
                found.append("distributed.deepspeed.offload_params: parameter offload needs zero_stage 3")
        return found


class Spec(_Strict):
    """Sections shared by every algorithm; subclasses name their TRL config."""

    algorithm: str
    model: ModelSpec
    data: DataSpec
    training: Dict[str, Any]
    distributed: DistributedSpec = DistributedSpec()
    resume: str = "auto"

    config_class: ClassVar[str]
    # Algorithm-specific training keys the package owns, beside PACKAGE_OWNED_TRAINING_KEYS.
    package_owned_training_keys: ClassVar[Dict[str, str]] = {}

    @classmethod
    def owned_training_keys(cls) -> Dict[str, str]:
        return {**PACKAGE_OWNED_TRAINING_KEYS, **cls.package_owned_training_keys}

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
        for name, source in (("train", self.data.train), ("eval", self.data.eval)):
            if source is not None and (source.path is None) == (source.name is None):
                found.append(
                    f"data.{name}: give exactly one of path (a local JSON/JSONL/Parquet file) or name (a hub data set)"
                )
        if self.resume not in ("auto", "never") and not self.resume.strip():
            found.append("resume: expected auto, never or a checkpoint path; got an empty string")
        found += self.distributed.problems()
        if "output_dir" not in training:
            found.append("training.output_dir: required; the directory the job writes the model and checkpoints to")
        max_steps = training.get("max_steps")
        if isinstance(max_steps, int) and (max_steps == 0 or max_steps < -1):
            found.append(f"training.max_steps: must be positive, or -1 to train by epochs; got {max_steps}")
        return found


class SFTSpec(Spec):
    """Supervised fine-tuning with ``trl.SFTTrainer``."""

    algorithm: Literal["sft"]
    config_class: ClassVar[str] = "SFTConfig"


class _ReferenceSpec(Spec):
    """Algorithms that regularise towards a frozen reference policy.

    ``reference_model`` (a path or hub id) defaults to a copy of the policy;
    with LoRA the reference is the policy with its adapter disabled.
    """

    reference_model: Optional[str] = None

    def problems(self, world_size: Optional[int]) -> List[str]:
        found = super().problems(world_size)
        if self.reference_model is not None and self.model.lora is not None:
            found.append(
                "reference_model: not used with model.lora (the reference is the policy with its adapter "
                "disabled); remove one of them"
            )
        return found


class DPOSpec(_ReferenceSpec):
    """Direct preference optimisation with ``trl.DPOTrainer``."""

    algorithm: Literal["dpo"]
    config_class: ClassVar[str] = "DPOConfig"


class RewardSpec(Spec):
    """Reward modelling (sequence classification) with ``trl.RewardTrainer``."""

    algorithm: Literal["reward"]
    config_class: ClassVar[str] = "RewardConfig"


class KTOSpec(_ReferenceSpec):
    """Kahneman-Tversky optimisation on unpaired labels with ``trl.KTOTrainer``."""

    algorithm: Literal["kto"]
    config_class: ClassVar[str] = "KTOConfig"


class ORPOSpec(Spec):
    """Odds-ratio preference optimisation (no reference) with ``trl.experimental.orpo.ORPOTrainer``."""

    algorithm: Literal["orpo"]
    config_class: ClassVar[str] = "ORPOConfig"


class RewardSource(_Strict):
    """One reward: exactly one of a user callable, a built-in, or a reward model; weighted."""

    function: Optional[str] = None  # "module:callable", importable in the job
    builtin: Optional[str] = None
    model: Optional[str] = None  # a sequence-classification model: path or hub id
    args: Dict[str, Any] = {}
    weight: float = 1.0

    def problems(self, where: str) -> List[str]:
        from posttrain.entrypoints.rewards import check_builtin  # plain Python, no torch

        given = [key for key in ("function", "builtin", "model") if getattr(self, key) is not None]
        if len(given) != 1:
            return [f"{where}: give exactly one of function (module:callable), builtin (a name) or model (a path)"]
        if self.function is not None and not re.fullmatch(r"[\w.]+:[\w.]+", self.function):
            return [f"{where}.function: expected module:callable (e.g. my_rewards:accuracy); got {self.function!r}"]
        if self.builtin is not None:
            return [f"{where}.builtin: {problem}" for problem in check_builtin(self.builtin, self.args)]
        if self.args:
            return [f"{where}.args: only built-in rewards take args"]
        return []


class _OnlineSpec(Spec):
    """Algorithms that generate completions and score them with ``rewards``."""

    rewards: List[RewardSource]
    package_owned_training_keys: ClassVar[Dict[str, str]] = {"reward_weights": "use rewards[].weight"}

    def problems(self, world_size: Optional[int]) -> List[str]:
        found = super().problems(world_size)
        if not self.rewards:
            found.append("rewards: give at least one reward (function, builtin or model)")
        for index, reward in enumerate(self.rewards):
            found += reward.problems(f"rewards.{index}")
        return found


class _GroupSpec(_OnlineSpec):
    """GRPO and RLOO: advantages compare ``num_generations`` completions of each prompt."""

    def problems(self, world_size: Optional[int]) -> List[str]:
        found = super().problems(world_size)
        mode = self.training.get("vllm_mode")
        if mode is not None and mode not in ("colocate", "server"):
            found.append(f"training.vllm_mode: expected colocate or server; got {mode!r}")
        return found + generation_batch_problems(self.training, self.config_class, world_size or 1)


def generation_batch_problems(training: Mapping[str, Any], config_class: str, world_size: int) -> List[str]:
    """TRL's generation-batch rules, checked at submit time with the world size from ``-j``.

    TRL raises these only once the job runs; here the message says which
    numbers to change.
    """

    def value(key: str) -> Any:
        return config_value(config_class, training, key)

    per_device, accumulation = value("per_device_train_batch_size"), value("gradient_accumulation_steps")
    generations = value("num_generations")
    generation_batch, steps = value("generation_batch_size"), value("steps_per_generation")
    if generation_batch is not None and steps is not None:
        return ["training.generation_batch_size, training.steps_per_generation: set at most one"]
    if generations is not None and generations < 2:
        return [f"training.num_generations: at least 2 completions per prompt are compared; got {generations}"]
    global_batch = per_device * world_size
    if generation_batch is None:
        generation_batch = global_batch * (steps if steps is not None else accumulation)
        how = f"{per_device} per device x {world_size} processes x {steps or accumulation} steps"
    elif generation_batch % global_batch:
        return [
            f"training.generation_batch_size: {generation_batch} is not a multiple of the global batch "
            f"({per_device} per device x {world_size} processes = {global_batch}); use a multiple of {global_batch}"
        ]
    else:
        how = "training.generation_batch_size"
    if generations and generation_batch % generations:
        divisors = [n for n in range(2, generation_batch + 1) if generation_batch % n == 0]
        return [
            f"training.num_generations: the generation batch ({generation_batch} = {how}) must divide by "
            f"num_generations ({generations}); set num_generations to one of {divisors}, or change "
            f"per_device_train_batch_size (or -j) so the batch is a multiple of {generations}"
        ]
    return []


class GRPOSpec(_GroupSpec):
    """Group relative policy optimisation with ``trl.GRPOTrainer`` (GSPO: importance_sampling_level: sequence)."""

    algorithm: Literal["grpo"]
    config_class: ClassVar[str] = "GRPOConfig"


class RLOOSpec(_GroupSpec):
    """REINFORCE leave-one-out with ``trl.RLOOTrainer``."""

    algorithm: Literal["rloo"]
    config_class: ClassVar[str] = "RLOOConfig"


class PPOSpec(_OnlineSpec):
    """PPO with posttrain's own trainer: policy, frozen reference, value model, rewards.

    ``value_model`` (path or hub id) defaults to the reward model where the
    rewards hold exactly one, else to the policy's weights with a fresh
    score head; ``reference_model`` defaults to a second load of the policy.
    """

    algorithm: Literal["ppo"]
    reference_model: Optional[str] = None
    value_model: Optional[str] = None
    config_class: ClassVar[str] = "PPOConfig"

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
    "sft": SFTSpec,
    "dpo": DPOSpec,
    "reward": RewardSpec,
    "kto": KTOSpec,
    "orpo": ORPOSpec,
    "grpo": GRPOSpec,
    "rloo": RLOOSpec,
    "ppo": PPOSpec,
}


# ---------------------------------------------------------------- loading


def load_spec(
    path: str,
    overrides: Sequence[str] = (),
    *,
    algorithm: Optional[str] = None,
    world_size: Optional[int] = None,
) -> Spec:
    """Reads a YAML spec, applies ``key.path=value`` overrides and validates it."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise SpecError([f"--spec: no such file: {path}"]) from None
    except OSError as e:
        raise SpecError([f"--spec: cannot read {path}: {e.strerror}"]) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError([f"--spec: {path} is not valid YAML: {e}"]) from None
    if not isinstance(raw, dict):
        raise SpecError([f"--spec: {path} must hold a mapping of sections (model, data, training, ...)"])
    return validate(apply_overrides(raw, overrides, algorithm), algorithm=algorithm, world_size=world_size)


def spec_from_json(text: str) -> Spec:
    """Parses a spec serialised by :meth:`Spec.to_json`, validating it again."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError([f"--spec-json: not valid JSON: {e}"]) from None
    if not isinstance(raw, dict):
        raise SpecError(["--spec-json: expected a JSON object"])
    return validate(raw)


def validate(raw: Mapping[str, Any], *, algorithm: Optional[str] = None, world_size: Optional[int] = None) -> Spec:
    """Validates a spec as plain data; raises SpecError listing every problem."""
    cls = _spec_class(raw, algorithm)
    problems = list(_unknown_keys(raw, cls))
    if problems:
        raise SpecError(problems)
    try:
        spec: Optional[Spec] = cls.model_validate(raw)
    except ValidationError as e:
        spec, problems = None, _translate(e)
    training, model = raw.get("training"), raw.get("model")
    if isinstance(training, dict):
        problems += _check_table(training, config_fields(cls.config_class), "training")
        problems += _check_positive(training)
    if isinstance(model, dict) and isinstance(model.get("lora"), dict):
        problems += _check_table(model["lora"], config_fields("LoraConfig"), "model.lora")
    if spec is not None and not problems:
        problems += spec.problems(world_size)
    if problems:
        raise SpecError(problems)
    assert spec is not None
    return spec


def _spec_class(raw: Mapping[str, Any], algorithm: Optional[str]) -> Type[Spec]:
    known = ", ".join(SPEC_CLASSES)
    name = raw.get("algorithm")
    if name is None:
        raise SpecError([f"algorithm: required; one of {known}"])
    if name not in SPEC_CLASSES:
        raise SpecError([f"algorithm: unknown {name!r}; expected one of {known}"])
    if algorithm is not None and name != algorithm:
        raise SpecError(
            [
                f"algorithm: this spec is for {name!r} but was given to posttrain.{algorithm}; "
                f"run it with posttrain.{name}, or use a {algorithm} spec (templates/{algorithm}/)"
            ]
        )
    return SPEC_CLASSES[name]


# ---------------------------------------------------------------- overrides


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str], algorithm: Optional[str] = None) -> Dict[str, Any]:
    """Returns a copy of ``raw`` with ``key.path=value`` overrides applied.

    Each value is converted by the type of the field it lands on; missing
    sections are created. ``raw`` itself is not modified.

    >>> apply_overrides({"algorithm": "sft", "training": {}}, ["training.learning_rate=1e-5"])["training"]
    {'learning_rate': 1e-05}
    """
    result = json.loads(json.dumps(raw))
    name = result.get("algorithm", algorithm)
    cls = SPEC_CLASSES.get(name) if isinstance(name, str) else None
    for override in overrides:
        if override.startswith("-"):
            raise SpecError(
                [f"override {override!r}: options such as {override.split('=')[0]} go before the key.path=value overrides"]
            )
        key, sep, text = override.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpecError([f"override {override!r}: expected key.path=value (e.g. training.learning_rate=1e-5)"])
        parts = key.split(".")
        if any(not part for part in parts):
            raise SpecError([f"override {override!r}: empty key segment in {key!r}"])
        target = _type_at(cls, parts) if cls else None
        value = target.convert(text) if target else FieldType(("any",)).convert(text)
        _set_path(result, parts, value, override)
    return result


def _set_path(root: Dict[str, Any], parts: List[str], value: Any, override: str) -> None:
    node: Any = root
    for depth, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            node = node[_list_index(node, part, parts[: depth + 1], override)]
            continue
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
        if not isinstance(node, (dict, list)):
            where = ".".join(parts[: depth + 1])
            raise SpecError([f"override {override!r}: {where} is a value, not a section"])
    if isinstance(node, list):
        node[_list_index(node, parts[-1], parts, override)] = value
    else:
        node[parts[-1]] = value


def _list_index(node: List[Any], part: str, parts: List[str], override: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        where = ".".join(parts)
        raise SpecError([f"override {override!r}: {where}: expected a list index below {len(node)}"])
    return int(part)


def _type_at(cls: Type[Spec], parts: Sequence[str]) -> Optional[FieldType]:
    """The FieldType of the field at ``parts``, or None where unknown."""
    if parts[0] == "training" and len(parts) == 2:
        return config_fields(cls.config_class).get(parts[1])
    if parts[:2] == ["model", "lora"] and len(parts) == 3:
        return config_fields("LoraConfig").get(parts[2])
    model: Optional[Type[BaseModel]] = cls
    annotation: Any = None
    for part in parts:
        if part.isdigit():
            continue  # an item of a list of sections: same model
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return None
        annotation = field.annotation
        model = _model_in(annotation)
    return field_type(annotation)


def _model_in(annotation: Any) -> Optional[Type[BaseModel]]:
    """The pydantic model an annotation holds (``X``, ``Optional[X]``, ``List[X]``), if any."""
    for arg in (annotation,) + typing.get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


# ---------------------------------------------------------------- checks


def _unknown_keys(raw: Mapping[str, Any], cls: Type[Spec]) -> Iterator[str]:
    """Unknown keys everywhere, each with the nearest valid key."""
    known_paths = list(_known_paths(cls))
    yield from _unknown_in(raw, cls, "", known_paths)
    training = raw.get("training")
    owned = cls.owned_training_keys()
    if isinstance(training, dict):
        for key in training:
            if key in owned:
                yield f"training.{key}: set by posttrain, not in training; {owned[key]}"
        allowed = set(config_fields(cls.config_class)) - set(owned)
        yield from _unknown_mapping_keys(
            {k: v for k, v in training.items() if k not in owned}, allowed, "training", known_paths
        )
    model = raw.get("model")
    if isinstance(model, dict) and isinstance(model.get("lora"), dict):
        yield from _unknown_mapping_keys(model["lora"], set(config_fields("LoraConfig")), "model.lora", known_paths)


def _unknown_in(raw: Mapping[str, Any], model: Type[BaseModel], prefix: str, known_paths: List[str]) -> Iterator[str]:
    for key, value in raw.items():
        path = f"{prefix}{key}"
        field = model.model_fields.get(key)
        if field is None:
            yield _unknown_message(path, set(model.model_fields), prefix, known_paths)
            continue
        inner = _model_in(field.annotation)
        if inner is not None and isinstance(value, dict):
            yield from _unknown_in(value, inner, f"{path}.", known_paths)
        elif inner is not None and isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, dict):
                    yield from _unknown_in(item, inner, f"{path}.{index}.", known_paths)


def _unknown_mapping_keys(raw: Mapping[str, Any], allowed: set, prefix: str, known_paths: List[str]) -> Iterator[str]:
    for key in raw:
        if key not in allowed:
            yield _unknown_message(f"{prefix}.{key}", allowed, f"{prefix}.", known_paths)


def _unknown_message(path: str, siblings: set, prefix: str, known_paths: List[str]) -> str:
    key = path[len(prefix) :]
    close = difflib.get_close_matches(key, sorted(siblings), n=1, cutoff=0.6)
    if close:
        return f"{path}: unknown key; did you mean {prefix}{close[0]}?"
    elsewhere = [p for p in known_paths if p.rsplit(".", 1)[-1] == key]
    if elsewhere:
        return f"{path}: unknown key here; it belongs at {elsewhere[0]}"
    return f"{path}: unknown key; valid keys here: {', '.join(sorted(siblings))}"


def _known_paths(cls: Type[Spec]) -> Iterator[str]:
    def walk(model: Type[BaseModel], prefix: str) -> Iterator[str]:
        for name, field in model.model_fields.items():
            yield f"{prefix}{name}"
            inner = _model_in(field.annotation)
            if inner is not None:
                yield from walk(inner, f"{prefix}{name}.")

    yield from walk(cls, "")
    yield from (f"training.{k}" for k in config_fields(cls.config_class) if k not in cls.owned_training_keys())
    yield from (f"model.lora.{k}" for k in config_fields("LoraConfig"))


def _check_table(values: Mapping[str, Any], table: Mapping[str, FieldType], prefix: str) -> List[str]:
    found = []
    for key, value in values.items():
        problem = table[key].check(value)
        if problem:
            found.append(f"{prefix}.{key}: {problem}")
    return found


def _check_positive(training: Mapping[str, Any]) -> List[str]:
    found = []
    for key in POSITIVE_TRAINING_KEYS:
        value = training.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
            found.append(f"training.{key}: must be positive; got {value}")
    return found


def _translate(error: ValidationError) -> List[str]:
    found = []
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"]) or "spec"
        if item["type"] == "missing":
            found.append(f"{path}: required")
        elif item["type"] == "extra_forbidden":
            continue  # reported with a suggestion by _unknown_keys
        else:
            found.append(f"{path}: {_lower_first(item['msg'])}; got {item['input']!r}")
    return found


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


# Keys that do not change what a checkpoint holds: a resume may differ in them.
NOT_TRAINING_RELEVANT = ("resume", "training.output_dir")


def spec_diff(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> List[Tuple[str, Any, Any]]:
    """The dotted keys whose values differ between two spec dumps.

    >>> spec_diff({"training": {"seed": 1, "max_steps": 5}}, {"training": {"seed": 2, "max_steps": 5}})
    [('training.seed', 1, 2)]
    """
    found = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += spec_diff(a, b, f"{prefix}{key}.")
        elif a != b:
            found.append((f"{prefix}{key}", a, b))
    return found
