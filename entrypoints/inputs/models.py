"""Every model and tokenizer a job loads, through one loader.

The trained model, a frozen reference, a teacher, a value model and reward
models all come from :func:`load_model`, so ``model``'s options (dtype,
revision, trust_remote_code, attention implementation) apply to each alike,
and the built-in tiny models (``tiny.py``) work wherever a model is named. What
they load with is read from the spec once, into a :class:`ModelLoading`. Which
extra models an algorithm has, and where each one's path comes from, is its spec
class's (``extra_models``, ``extra_model_paths``); its entrypoint loads each and
hands it to the trainer's keyword for it.
"""

import dataclasses
import functools
import importlib
import importlib.util
import os
import re
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import torch

from posttrain.components.spec.local_files import model_directory_problem
from posttrain.components.spec.messages import SpecError, first_line
from posttrain.components.spec.sections import ModelSpec
from posttrain.entrypoints.inputs import tiny
from posttrain.entrypoints.records.files import file_problem
from posttrain.entrypoints.speed import attention
from posttrain.entrypoints.speed.fast_paths import INSTALL_GPU

CAUSAL_LM = "AutoModelForCausalLM"
SEQUENCE_CLASSIFICATION = "AutoModelForSequenceClassification"
# the auto class of each extra model that is not a causal LM
EXTRA_MODEL_CLASSES = {"value_model": SEQUENCE_CLASSIFICATION}


@dataclasses.dataclass(frozen=True)
class ModelLoading:
    """How the job's models load, read from the spec once: its ``model`` section, the algorithm's auto class and
    LoRA task, the attention implementation chosen (``fast_paths.attention_implementation``), each extra model's
    path (None: none to load), and the router loss ``training`` weighs."""

    model: ModelSpec
    model_class: str = CAUSAL_LM
    lora_task: str = "CAUSAL_LM"
    attention: Optional[str] = None
    extra_models: Mapping[str, Optional[str]] = dataclasses.field(default_factory=dict)
    router_aux_loss_coef: Optional[float] = None

    @property
    def name_or_path(self) -> str:
        return self.model.name_or_path


def import_object(path: str) -> Any:
    """The object an import path ``"module:attr"`` (or ``module:Class.attr``) names: configs, trainers, user rewards."""
    module, _, attr = path.partition(":")
    if ".experimental" in module:
        # the registry chose it; TRL would warn on import
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    return functools.reduce(getattr, attr.split("."), importlib.import_module(module))


def import_user_function(path: str, where: str) -> Any:
    """The user's ``module:attr`` (a reward function, a tool), imported; whatever their module raises on import,
    said in one line naming ``where`` the spec names it."""
    module_name = path.partition(":")[0]
    try:
        return import_object(path)
    except (ImportError, AttributeError) as error:
        raise SpecError([f"{where}: cannot import {path} from {Path.cwd()}: {first_line(error)}"]) from None
    except Exception as error:  # noqa: BLE001 -- the user's module failed while it ran: its error, one line
        kind = type(error).__name__
        raise SpecError([f"{where}: importing {module_name} raised {kind}: {first_line(error)}"]) from None


def load_tokenizer(name_or_path: str, model: ModelSpec, padding_side: str) -> Any:
    """The tokenizer of ``name_or_path``, padding on ``padding_side``.

    transformers 5 does not save ``padding_side`` with a tokenizer, so it is
    set after loading; a missing pad token falls back to EOS.
    """
    from transformers import AutoTokenizer

    if name_or_path in tiny.BUILTINS:
        tokenizer = tiny.BUILTINS[name_or_path][0]()
    else:
        tokenizer = _from_pretrained(
            AutoTokenizer, name_or_path, revision=model.revision, trust_remote_code=model.trust_remote_code
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


def model_config(name_or_path: str, model: ModelSpec) -> Optional[Any]:
    """The model's config, read before its weights load; None where there is none to read (a hub id out of reach,
    a PEFT adapter's directory). The built-in tiny models are Llamas."""
    import transformers

    if name_or_path in tiny.BUILTINS:
        return transformers.LlamaConfig()
    try:
        return transformers.AutoConfig.from_pretrained(
            name_or_path, revision=model.revision, trust_remote_code=model.trust_remote_code
        )
    except (OSError, ValueError):
        return None


def model_attention(loading: ModelLoading) -> Optional[str]:
    """The attention implementation the models load with, registered with transformers where it is posttrain's
    own (on CPUs it runs SDPA sequence by sequence: the tests')."""
    implementation = loading.attention
    if implementation == attention.NAME:
        unavailable = attention.varlen_available()
        if torch.cuda.is_available() and unavailable is not None:
            raise SpecError([f"model.attn_implementation: {attention.NAME}: {unavailable}; use sdpa"])
        attention.register()
    return implementation


def load_model(
    name_or_path: str, loading: ModelLoading, tokenizer: Any, model_class: str, trained: bool = False
) -> Any:
    """Loads a model with a transformers auto class (``AutoModelForCausalLM``, ...) named by ``model_class``.

    ``loading`` gives the dtype, revision, loading options and attention; the
    ``trained`` model alone loads quantized where ``model.quantization`` says
    (the models beside it score or teach, in their dtype). A sequence
    classifier (reward or value model) gets one label: one score per sequence.
    """
    import transformers

    model, implementation = loading.model, model_attention(loading)
    quantization = quantization_config(model) if trained else None
    scores = "SequenceClassification" in model_class
    if name_or_path in tiny.BUILTINS:
        head = transformers.LlamaForSequenceClassification if scores else transformers.LlamaForCausalLM
        built = tiny.BUILTINS[name_or_path][1](tokenizer, head)
        if implementation is not None:
            built.set_attn_implementation(implementation)
        if quantization is not None:
            # bitsandbytes quantizes weights as they load
            quantized = head.from_pretrained(
                None,
                config=built.config,
                state_dict=built.state_dict(),
                dtype=model.dtype,
                quantization_config=quantization,
            )
            # loaded from no path, it is named "None", which PEFT looks up on the Hub when it saves the adapter
            quantized.name_or_path = quantized.config.name_or_path = built.name_or_path
            return quantized
        return built.to(getattr(torch, model.dtype)) if model.dtype != "auto" else built
    kwargs: Dict[str, Any] = {
        "revision": model.revision,
        "trust_remote_code": model.trust_remote_code,
        "dtype": model.dtype,
    }
    if implementation is not None:
        kwargs["attn_implementation"] = implementation
    if scores:
        kwargs["num_labels"] = 1
    if quantization is not None:
        kwargs["quantization_config"] = quantization
    loaded = _from_pretrained(getattr(transformers, model_class), name_or_path, **kwargs)
    if getattr(loaded.config, "pad_token_id", None) is None:
        loaded.config.pad_token_id = tokenizer.pad_token_id
    return loaded


def quantization_config(model: ModelSpec) -> Optional[Any]:
    """bitsandbytes' config for ``model.quantization``, or None: QLoRA's 4-bit NormalFloat with double quantization
    (Dettmers et al., 2023), computing in the model's dtype; ``auto``, in bfloat16 where the GPU has it, else float32."""
    if model.quantization is None:
        return None
    from transformers import BitsAndBytesConfig

    if model.dtype != "auto":
        compute = getattr(torch, model.dtype)
    else:
        compute = torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute
    )


def lora_config(loading: ModelLoading) -> Any:
    """PEFT's LoraConfig from ``model.lora`` for the algorithm's task type, or None."""
    if loading.model.lora is None:
        return None
    from peft import LoraConfig

    return LoraConfig(**{"task_type": loading.lora_task, **loading.model.lora})


def load_extra_model(field: str, loading: ModelLoading, tokenizer: Any) -> Any:
    """The model the spec field ``field`` names (one of the spec class's ``extra_models``), or None where there is
    none to load."""
    if field not in loading.extra_models:
        raise KeyError(f"extra model {field!r}: not one of the algorithm's extra_models")
    name_or_path = loading.extra_models[field]
    if name_or_path is None:
        return None
    if name_or_path != loading.name_or_path:
        check_same_tokenizer(name_or_path, loading.model, tokenizer, field)
    return load_model(name_or_path, loading, tokenizer, EXTRA_MODEL_CLASSES.get(field, CAUSAL_LM))


def check_same_tokenizer(name_or_path: str, model: ModelSpec, tokenizer: Any, where: str) -> None:
    """A model fed the trained model's token ids must read them as the same tokens.

    Every extra model (reference, teacher, value) scores the trained model's
    token ids directly; with another tokenizer it would score other text
    without a word. Its tokenizer may add tokens, not renumber them.
    """
    theirs = load_tokenizer(name_or_path, model, padding_side=tokenizer.padding_side).get_vocab()
    differing = [token for token, index in tokenizer.get_vocab().items() if theirs.get(token) != index]
    if differing:
        raise SpecError(
            [
                f"{where}: {name_or_path}'s tokenizer numbers {len(differing)} of the {len(tokenizer)} tokens of "
                f"{model.name_or_path}'s differently (e.g. {differing[0]!r}); it reads the trained model's token "
                "ids, so it needs the same tokenizer (a model trained from the same base)"
            ]
        )


def generation_config(name_or_path: str, model: ModelSpec) -> Optional[Any]:
    """The model's generation config as transformers gives a loaded model one (its generation_config.json, else
    its config's), read before its weights load; None for a built-in tiny model (its tokenizer's end token is its
    own) and where there is none to read."""
    import transformers

    if name_or_path in tiny.BUILTINS:
        return None
    try:
        return transformers.GenerationConfig.from_pretrained(name_or_path, revision=model.revision)
    except OSError:
        config = model_config(name_or_path, model)
        return transformers.GenerationConfig.from_model_config(config) if config is not None else None


def _from_pretrained(auto_class: Any, name_or_path: str, **kwargs: Any) -> Any:
    """``auto_class.from_pretrained``, a missing directory or unreachable hub id named plainly."""
    check_model_path(name_or_path)
    try:
        return auto_class.from_pretrained(name_or_path, **kwargs)
    except OSError as error:
        # after the checks the ranks agree on: a download or a disk can fail on one node
        raise SpecError([f"model: cannot load {name_or_path!r}: {error}"], this_rank_only=True) from None


def check_model_options(loading: ModelLoading) -> None:
    """``model.attn_implementation``, ``model.lora``, ``model.quantization`` and ``training.router_aux_loss_coef``,
    checked as transformers, PEFT and TRL check them.

    The model is built on the meta device, without weights (0.2 s for a 70B
    shape), and given its adapter there: a missing package (flash-attn,
    kernels), a LoRA target the model lacks or a router loss of a model
    without experts is one line before any model loads rather than a
    traceback from every rank once they have.
    """
    import transformers

    model, implementation = loading.model, model_attention(loading)
    if model.quantization is not None and importlib.util.find_spec("bitsandbytes") is None:
        raise SpecError(
            [
                f"model.quantization: {model.quantization} loads weights with bitsandbytes, which is not installed "
                f"({INSTALL_GPU}, or pip install bitsandbytes)"
            ]
        )
    router_loss = loading.router_aux_loss_coef
    # else the config alone answers
    builds = implementation is not None or model.lora is not None
    if not builds and not router_loss:
        return
    try:
        # Llamas: any shape answers for them
        if model.name_or_path in tiny.BUILTINS:
            config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1)
        else:
            config = transformers.AutoConfig.from_pretrained(
                model.name_or_path, revision=model.revision, trust_remote_code=model.trust_remote_code
            )
    except OSError:
        # a hub id out of reach: loading the model says so
        return
    # TRL's test
    if router_loss and not hasattr(config.get_text_config(), "output_router_logits"):
        raise SpecError(
            [
                f"training.router_aux_loss_coef: {router_loss} weighs the router loss of a mixture of "
                f"experts, and {model.name_or_path} ({config.model_type}) has no router; drop it"
            ]
        )
    if not builds:
        return
    options = {} if implementation is None else {"attn_implementation": implementation}
    try:
        with torch.device("meta"):
            built = getattr(transformers, loading.model_class).from_config(
                config, trust_remote_code=model.trust_remote_code, **options
            )
    except (ImportError, ValueError) as error:
        if implementation is not None and (isinstance(error, ImportError) or "attention" in str(error).lower()):
            raise SpecError([f"model.attn_implementation: {implementation}: {first_line(error)}"]) from None
        # anything else: loading the model says it
        return
    config_of_lora = lora_config(loading)
    if config_of_lora is not None:
        from peft import get_peft_model

        # the targets matched as PEFT matches them; no initialisation (it would compute on the meta device)
        try:
            get_peft_model(built, dataclasses.replace(config_of_lora, init_lora_weights=False))
        except ValueError as error:
            # PEFT's NoMatchingPeftModuleError among them
            raise SpecError([f"model.lora: {first_line(error)}"]) from None


def check_model_paths(loading: ModelLoading) -> None:
    """Every local model directory the job loads, checked before the first loads (reward models: resolve_rewards)."""
    check_model_path(loading.name_or_path)
    for field, name_or_path in loading.extra_models.items():
        if name_or_path is not None and name_or_path != loading.name_or_path:
            check_model_path(name_or_path, field)


def is_local_path(name_or_path: str) -> bool:
    """Whether a model name is a local path rather than a hub id (``org/name``: one slash, no such local directory).

    A chain's stages name the directories earlier runs write (``outputs/sft``):
    taken for hub ids, their absence would read as a hub error.
    """
    if name_or_path.startswith(("/", "./", "../", "~", "outputs/")) or name_or_path in (".", ".."):
        return True
    if Path(name_or_path).exists():
        return True
    parts = name_or_path.split("/")
    return len(parts) > 2 or (len(parts) == 2 and Path(parts[0]).is_dir())


# Tokenizer files transformers reads only with a package of its own, where the directory has no tokenizer.json:
# (file, the package's import name, its pip name, what transformers does without it)
TOKENIZER_READERS = (
    ("tekken.json", "mistral_common", "mistral-common", "would read it without its special tokens (no EOS)"),
    ("tokenizer.model", "sentencepiece", "sentencepiece", "cannot read it"),
)


def _check_tokenizer_reader(path: Path, name_or_path: str, where: str) -> None:
    """The package transformers needs for the directory's tokenizer (Mistral's tekken.json, a SentencePiece model)
    is installed in the job; without it the tokenizer fails to load, or loads wrong, on every rank."""
    if (path / "tokenizer.json").is_file():
        # transformers reads the fast tokenizer's own file first
        return
    for file, module, package, without in TOKENIZER_READERS:
        if (path / file).is_file() and importlib.util.find_spec(module) is None:
            reader = f"which transformers reads with the {package} package, not installed in the job"
            raise SpecError(
                [
                    f"{where}: {name_or_path}'s tokenizer is {file}, {reader} (transformers {without}): "
                    f"pip install {package}"
                ]
            )


def check_model_path(name_or_path: str, where: str = "model.name_or_path") -> None:
    """A local model directory exists and holds a model; a missing one is a mistake, not a hub id.

    transformers would call a directory without tokenizer files a missing
    tokenizer library, and a missing chain stage a hub error.
    """
    if name_or_path.startswith("builtin:") or not is_local_path(name_or_path):
        return
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise SpecError(
            [
                f"{where}: no such directory: {name_or_path} (relative paths start at {Path.cwd()})"
                + _written_by(name_or_path)
            ]
        )
    problem = model_directory_problem(path, name_or_path, where)
    if problem is not None:
        raise SpecError([problem])
    _check_tokenizer_reader(path, name_or_path, where)
    # a copy cut short loads as a traceback on every rank
    for weights in sorted(path.glob("*.safetensors")):
        problem = file_problem(weights)
        if problem is not None:
            raise SpecError([f"{where}: {weights} is not whole: {problem}; copy the model again"])


def check_weight_shapes(loading: ModelLoading) -> None:
    """The weights of a local model directory have the shapes its ``config.json`` makes.

    transformers would print a load report and raise on every rank; the model
    built on the meta device (no weights) against the weight files' headers
    (no tensors read) says it once, before any model loads. Called before the
    trainer's config exists: with ZeRO-3 configured, transformers would build
    it under DeepSpeed's partitioning, whose hooks outlive the check.
    """
    import transformers
    from safetensors import safe_open

    # there, and its weight files whole
    check_model_path(loading.name_or_path)
    path = Path(loading.name_or_path).expanduser()
    files = sorted(path.glob("*.safetensors")) if (path / "config.json").is_file() else []
    if not files:
        # a built-in, a hub id, an adapter or .bin weights: loading checks them
        return
    model = loading.model
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), trust_remote_code=model.trust_remote_code)
        if getattr(config, "quantization_config", None) is not None:
            # quantized weights are stored packed, in other shapes than the model's
            return
        with torch.device("meta"):
            built = getattr(transformers, loading.model_class).from_config(
                config, trust_remote_code=model.trust_remote_code
            )
    except (OSError, ValueError, ImportError):
        # a config transformers cannot build from: loading says why
        return
    expected = {key: list(tensor.shape) for key, tensor in built.state_dict().items()}
    for weights in files:
        with safe_open(str(weights), framework="pt") as stored:
            for key in stored.keys():
                shape = list(stored.get_slice(key).get_shape())
                if key in expected and shape != expected[key]:
                    raise SpecError(
                        [
                            f"model.name_or_path: {weights} holds {key} of shape {shape}, where {path}/"
                            f"config.json makes it {expected[key]}: the weights and config.json are of "
                            "different models"
                        ]
                    )


def _written_by(name_or_path: str) -> str:
    """The earlier run that writes a missing directory: a spec here or in templates/ with it as output_dir."""
    wanted = Path(name_or_path)
    for spec_file in sorted([*Path.cwd().glob("*.y*ml"), *Path.cwd().glob("templates/*/*.y*ml")]):
        try:
            text = spec_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for match in re.finditer(r"^\s*output_dir:\s*[\"']?([^\s\"'#]+)", text, flags=re.MULTILINE):
            written = Path(match.group(1))
            if wanted == written or written in wanted.parents:
                where = spec_file.relative_to(Path.cwd())
                return f"; it is written by an earlier run: training.output_dir of {where}; run that first"
    if wanted.parts[:1] == ("outputs",):
        return "; it is written by an earlier run (training.output_dir of that run); run that first"
    return ""
