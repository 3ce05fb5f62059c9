"""Fast paths compute what TRL's defaults compute: per-sequence losses of a padding-free batch equal the padded ones.

The models are shaped like real ones where it matters here: a BOS token, no
pad token of id 0 (the job pads with EOS), attention dropout (switched off by
``eval()`` for the comparison, as the numbers must be deterministic), rows of
very different lengths, and a ``max_length`` that truncates some of them.
"""

import configparser
import dataclasses
import logging
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import torch
import yaml
from transformers import LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from trl import SFTConfig, SFTTrainer
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from helpers import REPO, SHAPE, TEMPLATES
from posttrain.components.spec.fields import config_value
from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.registry import SPEC_CLASSES
from posttrain.entrypoints.inputs import tiny
from posttrain.entrypoints.job import spec_parts
from posttrain.entrypoints.job.config import build_config, training_arguments
from posttrain.entrypoints.speed import attention, fast_paths, gpu_memory

ATTENTION = ["sdpa", "eager"]


def llama(attention: str) -> torch.nn.Module:
    tokenizer = tiny.build_tokenizer_llama3()
    model = tiny.build_model_llama3(tokenizer, LlamaForCausalLM)
    model.config._attn_implementation = attention
    return model.eval()


def qwen2(attention: str) -> torch.nn.Module:
    config = Qwen2Config(**SHAPE)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.config._attn_implementation = attention
    return model.eval()


def rows(n: int = 6) -> List[Dict[str, List[int]]]:
    generator = torch.Generator().manual_seed(0)
    # a long tail: the padded batch is mostly padding
    lengths = [3, 41, 7, 19, 64, 12][:n]
    return [{"input_ids": torch.randint(1, 250, (length,), generator=generator).tolist()} for length in lengths]


def per_sequence_losses(model: torch.nn.Module, batch: Dict[str, torch.Tensor]) -> List[float]:
    """The mean token loss of each sequence in ``batch``, padded (one per row) or padding-free (one row)."""
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "position_ids") if key in batch}
    # no cache, as SFTTrainer.compute_loss: with one, transformers never looks for packing
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits
    labels = batch["labels"]
    token_losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100, reduction="none"
    ).view(labels.shape[0], -1)
    counted = labels[:, 1:] != -100
    if "position_ids" not in batch:
        return [(token_losses[i][counted[i]].mean()).item() for i in range(labels.shape[0])]
    # padding-free: a sequence starts where the position restarts at 0
    starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist() + [labels.shape[1]]
    return [token_losses[0, a : b - 1][counted[0, a : b - 1]].mean().item() for a, b in zip(starts, starts[1:])]


@pytest.mark.parametrize("build", [llama, qwen2], ids=["llama", "qwen2"])
@pytest.mark.parametrize("attention", ATTENTION)
def test_padding_free_losses_equal_padded_losses_per_sequence(build, attention: str) -> None:
    model, examples = build(attention), rows()
    assert fast_paths.padding_free_reason(model) is None
    padded = DataCollatorForLanguageModeling(pad_token_id=0)(examples)
    free = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(examples)
    # most of the padded batch was padding
    assert padded["input_ids"].numel() > 2 * free["input_ids"].numel()
    alone = [per_sequence_losses(model, DataCollatorForLanguageModeling(pad_token_id=0)([row]))[0] for row in examples]
    assert per_sequence_losses(model, padded) == pytest.approx(alone, abs=1e-5)
    assert per_sequence_losses(model, free) == pytest.approx(alone, abs=1e-5)
    # the check can fail: with a full mask over the row, each sequence sees those before it
    crossing = dict(free, attention_mask=torch.ones_like(free["input_ids"]))
    assert max(abs(a - b) for a, b in zip(per_sequence_losses(model, crossing)[1:], alone[1:])) > 1e-3


class RemoteCodeLlama(LlamaForCausalLM):
    """A model class from outside transformers, as trust_remote_code loads them."""


def test_padding_free_stays_off_where_attention_could_cross_rows() -> None:
    model = llama("sdpa")
    remote = RemoteCodeLlama(model.config)
    assert "not transformers' own models" in fast_paths.padding_free_reason(remote)
    model.config._attn_implementation = "paged|sdpa"
    assert "attn_implementation 'paged|sdpa' is not one of" in fast_paths.padding_free_reason(model)


def trainer_spec(tmp_path: Path, **training: object) -> Dict[str, object]:
    return {
        "algorithm": "sft",
        "model": {"name_or_path": tiny.NAME_LLAMA3},
        "data": {"train": {"path": "unused.jsonl"}},
        "training": {"output_dir": str(tmp_path), "max_length": 24, "report_to": "none", **training},
    }


def options_of(spec: object) -> fast_paths.FastPathOptions:
    return spec_parts.parts(spec).fast_paths


def defaults_of(spec: object, on_cuda: bool, training: Optional[Dict[str, object]] = None) -> Dict[str, object]:
    """The fast paths' config defaults for ``spec``, its own ``training`` unless told otherwise."""
    return fast_paths.config_defaults(options_of(spec), on_cuda, spec.training if training is None else training)


def sft_trainer(tmp_path: Path, model: torch.nn.Module, **training: object) -> SFTTrainer:
    """The SFT trainer the entrypoint builds: its collator chosen first (fast_paths.data_collator)."""
    from datasets import Dataset

    spec = validate(trainer_spec(tmp_path, **training))
    args = SFTConfig(**training_arguments(spec, dict(spec.training)))
    # 30 apples: longer than max_length, truncated
    words = [" ".join(["apple"] * n) for n in (2, 30, 5, 11)]
    dataset = Dataset.from_list([{"text": text} for text in words])
    tokenizer = tiny.build_tokenizer_llama3()
    collator = fast_paths.data_collator(options_of(spec), model, tokenizer, args, dataset)
    return SFTTrainer(model=model, args=args, data_collator=collator, train_dataset=dataset, processing_class=tokenizer)


def first_batch(trainer: SFTTrainer) -> Dict[str, torch.Tensor]:
    return trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])


def test_the_sft_trainer_goes_padding_free_with_max_length_still_enforced(tmp_path: Path) -> None:
    model = llama("sdpa")
    trainer = sft_trainer(tmp_path, model)
    assert fast_paths.applied(trainer, options_of(validate(trainer_spec(tmp_path)))) == [
        "padding_free",
        "no_activation_checkpointing",
        # the second: on CPU
    ]
    free = first_batch(trainer)
    assert "attention_mask" not in free and free["input_ids"].shape[0] == 1
    lengths = torch.diff(
        torch.tensor((free["position_ids"][0] == 0).nonzero().flatten().tolist() + [free["input_ids"].shape[1]])
    )
    # the long row was truncated to max_length, as with padding
    assert lengths.max().item() == 24
    # the same rows as TRL's default (padded) collator makes them: the same losses, sequence by sequence
    padded_trainer = sft_trainer(tmp_path, model, padding_free=False)
    assert dataclasses.replace(trainer.data_collator, padding_free=False) == padded_trainer.data_collator
    padded = first_batch(padded_trainer)
    assert per_sequence_losses(model, free) == pytest.approx(per_sequence_losses(model, padded), abs=1e-5)


@pytest.mark.parametrize(
    "training", [{"padding_free": False}, {"padding_free": True, "max_length": None}, {"packing": True}]
)
def test_a_key_the_user_set_is_left_alone(tmp_path: Path, training: Dict[str, object]) -> None:
    trainer = sft_trainer(tmp_path, llama("sdpa"), **training)
    expected = training.get("padding_free", False) or training.get("packing", False)
    assert trainer.data_collator.padding_free is expected


def test_on_gpus_padding_free_is_a_default_with_varlen_attention_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datasets import Dataset

    spec = validate(trainer_spec(tmp_path))
    args = SFTConfig(**training_arguments(spec, dict(spec.training)))
    model, tokenizer, dataset = llama("sdpa"), tiny.build_tokenizer_llama3(), Dataset.from_list([{"text": "a"}])
    options = options_of(spec)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # SDPA on a GPU: a dense mask over the row, 2x slower than padding
    assert fast_paths.data_collator(options, model, tokenizer, args, dataset) is None
    for implementation in ("flash_attention_2", "torch_varlen"):
        model.config._attn_implementation = implementation
        assert fast_paths.data_collator(options, model, tokenizer, args, dataset).padding_free


def test_packing_the_model_cannot_keep_apart_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="training.packing: packed sequences could attend to each other: Remote"):
        sft_trainer(tmp_path, RemoteCodeLlama(llama("sdpa").config), packing=True)
    # left to us: off, and said in the log
    trainer = sft_trainer(tmp_path, RemoteCodeLlama(llama("sdpa").config))
    assert fast_paths.applied(trainer, options_of(validate(trainer_spec(tmp_path)))) == [
        "no_activation_checkpointing"
        # the trainer was built on CPU
    ]


def test_packing_with_an_attention_that_could_cross_rows_is_refused_before_the_job() -> None:
    def spec(attention: str, **training: object) -> Dict[str, object]:
        return {
            "algorithm": "sft",
            "model": {"name_or_path": tiny.NAME, "attn_implementation": attention},
            "data": {"train": {"path": "x.jsonl"}},
            "training": {"output_dir": "out", **training},
        }

    # padding-free: no truncation
    for switch in ({"packing": True}, {"padding_free": True, "max_length": None}):
        key = next(iter(switch))
        with pytest.raises(SpecError, match=f"training.{key}: with model.attn_implementation 'paged_attention' packed"):
            validate(spec("paged_attention", **switch))
    validate(spec("sdpa", packing=True))
    validate(spec("paged_attention", packing=False))


def test_liger_is_a_default_on_cuda_only_where_installed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spec = validate(
        {
            "algorithm": "sft",
            "model": {"name_or_path": tiny.NAME},
            "data": {"train": {"path": "x.jsonl"}},
            "training": {"output_dir": "out"},
        }
    )
    installed = {"liger_kernel": object()}
    monkeypatch.setattr(fast_paths.importlib.util, "find_spec", lambda name: installed.get(name))
    assert defaults_of(spec, on_cuda=True) == {"use_liger_kernel": True}
    assert defaults_of(spec, on_cuda=False) == {"activation_checkpointing": False}
    # not for online RL, whose steps its layer kernels slowed (BENCHMARKS.md)
    for algorithm in ("grpo", "rloo"):
        rl = validate(
            {
                **spec.model_dump(exclude_unset=True),
                "algorithm": algorithm,
                "rewards": [{"function": "my_rewards:accuracy"}],
            }
        )
        assert defaults_of(rl, on_cuda=True) == {}
    off = spec.model_copy(update={"training": {"output_dir": "out", "use_liger_kernel": False}})
    assert defaults_of(off, on_cuda=True) == {}
    installed.clear()
    with caplog.at_level(logging.INFO, logger="posttrain"):
        assert defaults_of(spec, on_cuda=True) == {}
    # the job's first lines say why, and what installs it
    assert caplog.messages == ["Liger's kernels are off: liger-kernel is not installed (pip install 'posttrain[gpu]')"]


def test_activation_checkpointing_is_off_by_default_for_sft_on_cpu() -> None:
    def spec(algorithm: str, **training: object):
        return validate(
            {
                "algorithm": algorithm,
                "model": {"name_or_path": tiny.NAME},
                "data": {"train": {"path": "x.jsonl"}},
                "training": {"output_dir": "out", **training},
            }
        )

    assert defaults_of(spec("sft"), on_cuda=False) == {"activation_checkpointing": False}
    assert defaults_of(spec("sft"), on_cuda=True) == {}
    # either name, either value: the user's
    for key in ("activation_checkpointing", "gradient_checkpointing"):
        assert defaults_of(spec("sft", **{key: True}), on_cuda=False) == {}
    # options: the user wants it
    options = spec("sft", activation_checkpointing_kwargs={"use_reentrant": False})
    assert defaults_of(options, on_cuda=False) == {}
    # measured slower there (BENCHMARKS.md)
    assert defaults_of(spec("dpo"), on_cuda=False) == {}


def sft_spec(model: str, **training: object):
    spec = {"algorithm": "sft", "model": {"name_or_path": model}, "data": {"train": {"path": "x.jsonl"}}}
    return validate({**spec, "training": {"output_dir": "out", **training}})


@pytest.fixture
def h100(monkeypatch: pytest.MonkeyPatch) -> None:
    """An 80 GB GPU (81,559 MiB, as nvidia-smi gives an H100's), with Liger's fused loss for the model."""
    properties = type("Properties", (), {"total_memory": 81559 * 2**20})
    monkeypatch.setattr(gpu_memory.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(gpu_memory.torch.cuda, "get_device_properties", lambda device: properties)
    monkeypatch.setattr(fast_paths, "fused_loss", lambda training, shape: training.get("use_liger_kernel", True))


def model_directory(tmp_path: Path, name: str, **shape: object) -> str:
    """A model's config alone (Qwen2's, bfloat16 unless given): what the estimates read."""
    heads = shape["hidden_size"] // 64
    config = {"num_attention_heads": heads, "num_key_value_heads": heads, "dtype": "bfloat16", **shape}
    Qwen2Config(**config).save_pretrained(tmp_path / name)
    return str(tmp_path / name)


def qwen_0_5b(tmp_path: Path, **changes: object) -> str:
    shape = dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_key_value_heads=2, vocab_size=151936
    )
    shape.update(changes)
    # as Qwen2.5-0.5B's
    shape.setdefault("tie_word_embeddings", True)
    return model_directory(tmp_path, "0.5b", **shape)


def qwen_1_5b(tmp_path: Path) -> str:
    shape = dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_key_value_heads=2, vocab_size=151936
    )
    shape["tie_word_embeddings"] = True
    return model_directory(tmp_path, "1.5b", **shape)


def test_on_a_gpu_sft_trains_64_rows_of_max_length_where_the_spec_leaves_the_step_and_they_fit(
    h100: None, tmp_path: Path
) -> None:
    small = qwen_0_5b(tmp_path)
    assert fast_paths.gpu_batch(options_of(sft_spec(small)), on_cuda=True) == {"per_device_train_batch_size": 64}
    assert fast_paths.gpu_batch(options_of(sft_spec(small, max_length=4096)), on_cuda=True) == {
        "per_device_train_batch_size": 16
    }
    assert fast_paths.gpu_batch(options_of(sft_spec(qwen_1_5b(tmp_path))), on_cuda=True) == {
        "per_device_train_batch_size": 64
    }
    huge = model_directory(tmp_path, "7b", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28)
    assert (
        fast_paths.gpu_batch(options_of(sft_spec(huge)), on_cuda=True) == {}
        # its state alone nears the GPU's memory
    )
    left = ({"per_device_train_batch_size": 8}, {"gradient_accumulation_steps": 4}, {"use_liger_kernel": False})
    for training in (*left, {"max_length": None}):
        assert fast_paths.gpu_batch(options_of(sft_spec(small, **training)), on_cuda=True) == {}, training
    assert fast_paths.gpu_batch(options_of(sft_spec(small)), on_cuda=False) == {}
    # no config to estimate from
    assert fast_paths.gpu_batch(options_of(sft_spec(tiny.NAME)), on_cuda=True) == {}
    dpo = validate({**dict(trainer_spec(Path("out"))), "algorithm": "dpo", "model": {"name_or_path": small}})
    assert fast_paths.gpu_batch(options_of(dpo), on_cuda=True) == {}


def grpo_step(model: str, **training: object) -> Dict[str, object]:
    """What GRPO's job decides for its loop on an H100 (fast_paths.micro_batches): prompts of up to 200 tokens,
    completions of up to 512, 32 prompts x 8 completions per device and step unless told otherwise."""
    raw = {"algorithm": "grpo", "model": {"name_or_path": model}, "data": {"train": {"path": "x.jsonl"}}}
    step = {"output_dir": "out", "per_device_train_batch_size": 256, "num_generations": 8, "use_vllm": False}
    spec = validate({**raw, "rewards": [{"builtin": "exact_match"}], "training": {**step, **training}})
    args = build_config(spec.config_class, {**spec.training, "use_cpu": True, "bf16": False})
    return fast_paths.micro_batches(options_of(spec), True, args, lambda: 200)


def test_on_a_gpu_grpo_s_step_trains_in_micro_batches_only_where_its_rows_would_not_fit(
    h100: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 7B model's state takes most of the GPU: its 256 rows of up to 712 tokens train as 8 micro-batches of 32
    (activations of 8.5 GB each, checkpointed); a 0.5B model's fit whole. The split keeps the step: the same
    generation batch (steps_per_generation scaled with it where the spec sets it) and optimizer steps."""
    shape_7b = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28)
    huge = model_directory(tmp_path, "7b", **shape_7b)
    with caplog.at_level(logging.INFO, logger="posttrain"):
        assert grpo_step(huge) == {"per_device_train_batch_size": 32, "gradient_accumulation_steps": 8}
    assert "256 rows per device (of up to 712 tokens) train as 8 micro-batches of 32" in caplog.text
    assert grpo_step(huge, steps_per_generation=2) == {
        "per_device_train_batch_size": 32,
        "gradient_accumulation_steps": 8,
        "steps_per_generation": 16,
    }
    # TRL derives steps_per_generation from the generation batch the spec sets
    assert grpo_step(huge, generation_batch_size=512)["gradient_accumulation_steps"] == 8
    # without checkpointing a 1.5B model's rows take 2.2 MB a token; colocated vLLM holds 30% of the GPU
    assert grpo_step(qwen_1_5b(tmp_path), activation_checkpointing=False)["per_device_train_batch_size"] == 32
    both = grpo_step(qwen_1_5b(tmp_path), activation_checkpointing=False, use_vllm=True)
    assert both["per_device_train_batch_size"] == 16
    # not even one row fits beside vLLM: the step stays the spec's
    assert grpo_step(huge, use_vllm=True) == {}
    assert grpo_step(qwen_0_5b(tmp_path)) == {}
    # the loss depends on the split (a token mean per micro-batch), or the spec sets the split
    for training in ({"loss_type": "bnpo"}, {"entropy_coef": 0.01}, {"top_entropy_quantile": 0.2}):
        assert grpo_step(huge, **training) == {}, training
    assert grpo_step(huge, per_device_train_batch_size=64, gradient_accumulation_steps=4) == {}
    # attention dropout would draw per micro-batch
    dropping = model_directory(tmp_path, "7b-dropout", **shape_7b, attention_dropout=0.1)
    assert grpo_step(dropping) == {}
    # the other loss types of TRL 1.16's GRPOTrainer._compute_loss
    for loss in ("grpo", "sapo", "dr_grpo", "dapo", "cispo", "vespo", "luspo"):
        # luspo's sequence-level setup
        level = {"importance_sampling_level": "sequence"} if loss == "luspo" else {}
        assert grpo_step(huge, loss_type=loss, **level)["gradient_accumulation_steps"] == 8, loss


def test_liger_s_fused_loss_counts_only_where_liger_is_made_for_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    shape = gpu_memory.ModelShape("qwen2", 896, 4864, 24, 151936, True, 0.0, 2)
    patches = type("Module", (), {"MODEL_TYPE_TO_APPLY_LIGER_FN": {"qwen2": None}})
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", patches)
    monkeypatch.setattr(fast_paths.importlib.util, "find_spec", lambda name: object())
    assert fast_paths.fused_loss({}, shape)
    assert not fast_paths.fused_loss({"use_liger_kernel": False}, shape)
    assert not fast_paths.fused_loss({}, dataclasses.replace(shape, model_type="gpt2"))
    monkeypatch.setattr(fast_paths.importlib.util, "find_spec", lambda name: None)
    assert not fast_paths.fused_loss({}, shape)


def test_on_a_gpu_activation_checkpointing_is_off_where_the_step_fits(
    h100: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    small, large = qwen_0_5b(tmp_path), qwen_1_5b(tmp_path)
    batch = {"per_device_train_batch_size": 64}
    caplog.set_level("INFO", logger="posttrain")
    defaults = defaults_of(sft_spec(small), on_cuda=True, training=batch)
    assert defaults == {"activation_checkpointing": False} or defaults == {
        "use_liger_kernel": True,
        "activation_checkpointing": False,
    }
    assert "on a GPU of 86 GB: 64 rows of up to 1024 tokens per device and step" in caplog.text
    assert "activations of up to 68 GB and a training state of 4 GB fit, so activation checkpointing is off" in (
        caplog.text
    )
    for spec, training, off in (
        # 144 GB of activations
        (sft_spec(large), batch, False),
        (sft_spec(small), {"per_device_train_batch_size": 128}, False),
        # the user's
        (sft_spec(small, activation_checkpointing=True), batch, False),
        # with the logits
        (sft_spec(small, use_liger_kernel=False), {"per_device_train_batch_size": 8}, True),
        (sft_spec(small, use_liger_kernel=False), {"per_device_train_batch_size": 48}, False),
    ):
        defaults = defaults_of(spec, on_cuda=True, training={**spec.training, **training})
        assert ("activation_checkpointing" in defaults) is off, (spec.training, training)
    assert "activations of up to 9 GB, logits of 12 GB and a training state of 4 GB fit" in caplog.text
    fsdp = validate({**dict(trainer_spec(Path("out"))), "model": {"name_or_path": small}, "distributed": {"fsdp": {}}})
    assert "activation_checkpointing" not in defaults_of(fsdp, on_cuda=True, training=batch)
    # 7B's shape, 8 rows: 39 GB of activations beside 61 GB of full training state, or 15 GB of LoRA's frozen weights
    huge = model_directory(tmp_path, "7b", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28)
    eight = {"per_device_train_batch_size": 8}
    assert "activation_checkpointing" not in defaults_of(sft_spec(huge), on_cuda=True, training=eight)
    lora = validate({**sft_spec(huge).model_dump(exclude_unset=True), "model": {"name_or_path": huge, "lora": {}}})
    assert defaults_of(lora, on_cuda=True, training=eight) == {"activation_checkpointing": False}


def test_the_gpu_extra_installs_what_the_gpu_defaults_run() -> None:
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    extra = [line for line in setup["options.extras_require"]["gpu"].splitlines() if line]
    # Liger's kernels and fused loss; torch's varlen attention (attention.varlen_available: torch 2.11 or later);
    # QLoRA's 4-bit weights (model.quantization)
    assert extra == ["liger-kernel>=0.8.5", "torch>=2.11", "bitsandbytes>=0.50"]
    assert fast_paths.INSTALL_GPU == "pip install 'posttrain[gpu]'"


# what turns a fast path off where a spec sets it (fast_paths.py)
OFF_SWITCHES = {
    "padding_free": ["padding_free"],
    "use_liger_kernel": ["use_liger_kernel"],
    "gpu_batch": ["per_device_train_batch_size", "gradient_accumulation_steps"],
    "no_activation_checkpointing": ["activation_checkpointing"],
    "micro_batches": ["gradient_accumulation_steps"],
    "rollout_generator": ["generation.rollout_generator"],
}


def gpu_templates() -> List[str]:
    """The templates whose command asks for GPUs, of the algorithms that take fast paths."""
    found = []
    for path in sorted(TEMPLATES.glob("*/*.yaml")):
        command = path.read_text().splitlines()[1]
        algorithm = yaml.safe_load(path.read_text()).get("algorithm")
        asks = re.search(r"--gpu [1-9]|-h gpu\.", command)
        if asks and algorithm in SPEC_CLASSES and SPEC_CLASSES[algorithm].fast_paths:
            found.append(str(path.relative_to(TEMPLATES)))
    return found


def shaped(raw: Dict[str, Any], tmp_path: Path) -> Dict[str, Any]:
    """The template with its hub model replaced by a local config of the same shape (the estimates read it)."""
    name = raw["model"]["name_or_path"]
    if name.startswith("builtin:"):
        return raw
    sizes = {
        "0.5B": lambda: qwen_0_5b(tmp_path),
        "1.5B": lambda: qwen_1_5b(tmp_path),
        "7B": lambda: model_directory(
            tmp_path, "7b", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, vocab_size=152064
        ),
    }
    size = next((size for size in sizes if f"-{size}" in name), None)
    if size is None:
        # a model of a type the GPU defaults are not made for (Pythia: GPT-NeoX): its config decides nothing here
        return raw
    return {**raw, "model": {**raw["model"], "name_or_path": sizes[size]()}}


def chosen(raw: Dict[str, Any]) -> Dict[str, Any]:
    """What the job runs on an H100 for ``raw``: the attention, and each fast path's key as the trainer gets it
    (padding-free rows: the spec's value, else the job's choice, made by its collator)."""
    spec = validate(raw)
    options = options_of(spec)
    training = {**fast_paths.gpu_batch(options, on_cuda=True), **spec.training}
    training = {**fast_paths.config_defaults(options, True, training), **training}
    # the old name of activation checkpointing's switch, as the trainer reads it
    if "gradient_checkpointing" in training:
        training.setdefault("activation_checkpointing", training.pop("gradient_checkpointing"))
    settings = {}
    for path in spec.fast_paths:
        for key in OFF_SWITCHES[path]:
            if key == "padding_free":
                settings[key] = training.get(key, "the job's choice")
            elif key == "generation.rollout_generator":
                settings[key] = spec.generation.rollout_generator
            elif key == "activation_checkpointing":
                # unset, TRL's gradient_checkpointing default (as a sharding strategy reads it)
                settings[key] = training.get(key, config_value(spec.config_class, training, "gradient_checkpointing"))
            else:
                settings[key] = config_value(spec.config_class, training, key)
    return {"model.attn_implementation": fast_paths.attention_implementation(options), **settings}


def without_off_switches(raw: Dict[str, Any]) -> Dict[str, Any]:
    switches = {key for keys in OFF_SWITCHES.values() for key in keys} | {"gradient_checkpointing"}
    training = {k: v for k, v in raw["training"].items() if k not in switches}
    model = {k: v for k, v in raw["model"].items() if k != "attn_implementation"}
    generation = {k: v for k, v in raw.get("generation", {}).items() if k != "rollout_generator"}
    return {**raw, "model": model, "training": training, **({"generation": generation} if "generation" in raw else {})}


@pytest.mark.parametrize("template", gpu_templates())
def test_a_gpu_template_turns_off_no_fast_path_it_does_not_explain(
    template: str, h100: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(attention, "varlen_available", lambda: None)
    monkeypatch.setattr(fast_paths.importlib.util, "find_spec", lambda name: object())
    raw = shaped(yaml.safe_load((TEMPLATES / template).read_text()), tmp_path)
    header = "\n".join(line for line in (TEMPLATES / template).read_text().splitlines() if line.startswith("#"))
    as_written, by_the_job = chosen(raw), chosen(without_off_switches(raw))
    unexplained = [
        key for key in as_written if as_written[key] != by_the_job[key] and key.rpartition(".")[2] not in header
    ]
    assert not unexplained, {key: (as_written[key], by_the_job[key]) for key in unexplained}


def test_the_shipped_0_5b_sft_template_runs_every_gpu_default(
    h100: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(attention, "varlen_available", lambda: None)
    monkeypatch.setattr(fast_paths.importlib.util, "find_spec", lambda name: object())
    raw = shaped(yaml.safe_load((TEMPLATES / "sft/qwen2.5-0.5b.yaml").read_text()), tmp_path)
    # 65,536 tokens per step of max_length 2048, Liger, no activation checkpointing, torch_varlen (padding-free)
    assert chosen(raw) == {
        "model.attn_implementation": attention.NAME,
        "padding_free": "the job's choice",
        "use_liger_kernel": True,
        "per_device_train_batch_size": 32,
        "gradient_accumulation_steps": 1,
        "activation_checkpointing": False,
    }
