"""Values, not only types: ranges and choices from value_rules/, and valid input accepted.

Each bad value is refused with one line naming the key, the value and what is
allowed; each value TRL accepts passes the validator and TRL's own config.
"""

import os
import re
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml

from helpers import REPO, load_template
from posttrain.components import algorithms
from posttrain.components.spec import values
from posttrain.components.spec.fields import config_fields
from posttrain.components.spec.loading import load_spec, validate
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.registry import SPEC_CLASSES
from posttrain.components.spec.values import Range, rules

CONFIGS = sorted({cls.config_class for cls in SPEC_CLASSES.values()})


def test_every_row_names_fields_the_installed_trl_has() -> None:
    """Fails when TRL gains or loses a field a row names: the table belongs to one TRL version."""
    for row in rules():
        named = row.get("configs", CONFIGS)
        having = [config for config in named if row["field"] in config_fields(config)]
        assert having, f"{row['field']}: no config class has it any more"
        if "configs" in row:
            assert having == named, f"{row['field']}: missing from {set(named) - set(having)}"
        kinds = {
            "field",
            "configs",
            "range",
            "choices",
            "also",
            "when",
            "unless",
            "requires",
            "keys",
            "needs",
            "pattern",
            "expected",
            "unused",
            "length_of",
            "reason",
        }
        assert row["reason"].strip() and set(row) <= kinds
        conditional = "when" in row or "unless" in row
        assert conditional <= ("requires" in row or "unused" in row or "keys" in row)
        # alone: what those trainers require
        assert "requires" not in row or conditional or "configs" in row
        assert "unless" not in row or "keys" not in row
        # never read: by the trainers it names
        assert "unused" not in row or conditional or "configs" in row
        assert set(row.get("needs", [])) <= set(row.get("keys", []))
        assert ("pattern" in row) == ("expected" in row)
        # a combination's other fields too
        for config in having:
            assert set(row.get("when", {})) <= set(config_fields(config)), f"{row['field']}: when {row['when']}"
        if "range" in row:
            Range.parse(row["range"])
        if isinstance(row.get("requires"), str):
            Range.parse(row["requires"])


def test_the_table_follows_the_installed_trl_version() -> None:
    from importlib import metadata

    minor = ".".join(metadata.version("trl").split(".")[:2])
    assert (values.RULES_DIR / f"trl-{minor}.yaml").is_file(), f"write value_rules/trl-{minor}.yaml for TRL {minor}"


def spec_with(algorithm: str, **training: Any) -> Dict[str, Any]:
    raw = load_template(f"{algorithm}/tiny.yaml")
    raw["training"].update(training)
    return raw


BAD_VALUES = [
    ("grpo", {"top_p": 1.5}, "training.top_p: 1.5 is out of range; expected 0 < top_p <= 1"),
    ("grpo", {"temperature": 0.0}, "training.temperature: 0.0 is out of range; expected temperature > 0"),
    ("online_dpo", {"temperature": 0}, "training.temperature: 0 is out of range; expected temperature > 0"),
    ("dpo", {"beta": -0.1}, "training.beta: -0.1 is out of range; expected beta >= 0"),
    (
        "dpo",
        {"label_smoothing": 0.7},
        "training.label_smoothing: 0.7 is out of range; expected 0 <= label_smoothing <= 0.5",
    ),
    (
        "kto",
        {"desirable_weight": -1.0},
        "training.desirable_weight: -1.0 is out of range; expected desirable_weight > 0",
    ),
    ("grpo", {"num_iterations": 0}, "training.num_iterations: 0 is out of range; expected num_iterations >= 1"),
    ("rloo", {"steps_per_generation": 0}, "training.steps_per_generation: 0 is out of range"),
    ("grpo", {"generation_batch_size": -16}, "training.generation_batch_size: -16 is out of range"),
    ("grpo", {"epsilon": -0.2}, "training.epsilon: -0.2 is out of range; expected epsilon > 0"),
    ("ppo", {"gamma": 1.5}, "training.gamma: 1.5 is out of range; expected 0 <= gamma <= 1"),
    ("ppo", {"cliprange": -0.1}, "training.cliprange: -0.1 is out of range; expected cliprange > 0"),
    ("ppo", {"kl_coef": -1.0}, "training.kl_coef: -1.0 is out of range; expected kl_coef >= 0"),
    ("ppo", {"num_ppo_epochs": 0}, "training.num_ppo_epochs: 0 is out of range; expected num_ppo_epochs >= 1"),
    ("distill", {"beta": 1.5}, "training.beta: 1.5 is out of range; expected 0 <= beta <= 1"),
    ("online_dpo", {"beta": [0.1, -0.2]}, "training.beta: -0.2 is out of range; expected beta >= 0"),
    ("orpo", {"beta": -1.0}, "training.beta: -1.0 is out of range"),
    ("sft", {"adam_beta2": 1.0}, "training.adam_beta2: 1.0 is out of range; expected 0 <= adam_beta2 < 1"),
    ("reward", {"weight_decay": -0.01}, "training.weight_decay: -0.01 is out of range"),
    (
        "sft",
        {"loss_type": "nl"},
        "training.loss_type: expected one of 'nll', 'dft', 'chunked_nll'; got 'nl'; did you mean 'nll'?",
    ),
    ("dpo", {"loss_type": "ipp"}, "training.loss_type: expected one of 'sigmoid', 'hinge', 'ipo'"),
    ("dpo", {"loss_type": ["sigmoid", "bogus"]}, "training.loss_type: expected items from one of 'sigmoid'"),
    ("dpo", {"f_divergence_type": "kl"}, "training.f_divergence_type: expected one of 'reverse_kl', 'forward_kl'"),
    ("grpo", {"loss_type": "ppo"}, "training.loss_type: expected one of 'grpo', 'dr_grpo', 'dapo', 'bnpo', 'cispo'"),
    (
        "grpo",
        {"importance_sampling_level": "seq"},
        "training.importance_sampling_level: expected one of 'token', 'sequence'",
    ),
    (
        "grpo",
        {"scale_rewards": "all"},
        "training.scale_rewards: expected one of 'group', 'batch', 'none' or true/false",
    ),
    ("kto", {"loss_type": "sigmoid"}, "training.loss_type: expected one of 'kto', 'apo_zero_unpaired'"),
    # combinations (the first key is the one named; tests/unit/job/test_runtime.py builds TRL's trainers with them)
    (
        "grpo",
        {"beta": 0.0, "sync_ref_model": True},
        "training.beta: 0.0 cannot go with sync_ref_model: true; expected beta > 0",
    ),
    (
        "dpo",
        {"label_smoothing": 0.0, "loss_type": ["sigmoid", "exo_pair"]},
        "training.label_smoothing: 0.0 cannot go with loss_type: [sigmoid, exo_pair]; expected label_smoothing > 0",
    ),
    (
        "dpo",
        {"f_divergence_type": "js_divergence", "loss_type": "apo_zero"},
        "training.f_divergence_type: js_divergence cannot go with loss_type: apo_zero; expected reverse_kl",
    ),
    (
        "sft",
        {"max_length": 64, "padding_free": True},
        "training.max_length: 64 cannot go with padding_free: true, packing: false (TRL's default); expected null",
    ),
    (
        "dpo",
        {"optim_args": "betas=(0.9,0.95)", "optim": "sgd"},
        "training.optim_args: betas=(0.9,0.95) is not key=value pairs separated by commas (transformers splits the text at each comma",
    ),
    (
        "sft",
        {"optim_args": "eps=1e-6"},
        "training.optim_args: eps=1e-6 cannot go with optim: adamw_torch_fused (TRL's default); expected null or '' (transformers reads no optim_args for this optimizer",
    ),
    # the keys of a mapping (tests/integration/test_checkpointing_options.py trains with them)
    (
        "dpo",
        {"activation_checkpointing_kwargs": {"selective": True}},
        "training.activation_checkpointing_kwargs.selective: unknown key; valid keys here: debug, determinism_check, early_stop, preserve_rng_state, use_reentrant (torch.utils.checkpoint's options; also every_n_layers and offload for sft",
    ),
    (
        "grpo",
        {"gradient_checkpointing_kwargs": {"every_n_layers": 2}},
        "training.gradient_checkpointing_kwargs.every_n_layers: unknown key",
    ),
    (
        "sft",
        {"activation_checkpointing_kwargs": {"use_reentrent": False}},
        "training.activation_checkpointing_kwargs.use_reentrent: unknown key; did you mean training.activation_checkpointing_kwargs.use_reentrant?",
    ),
    (
        "sft",
        {"lr_scheduler_kwargs": {"min_lr_rate": 0.1}, "lr_scheduler_type": "cosine"},
        "training.lr_scheduler_kwargs.min_lr_rate: unknown key; valid keys here: last_epoch, num_cycles (the options of transformers' cosine schedules)",
    ),
    (
        "sft",
        {"lr_scheduler_kwargs": {"num_cycles": 2}},
        "training.lr_scheduler_kwargs.num_cycles: unknown key; none are taken with lr_scheduler_type: constant (transformers passes no options",
    ),
    (
        "grpo",
        {"lr_scheduler_kwargs": {"min_lr": 0.0, "min_lr_rate": 0.1}, "lr_scheduler_type": "cosine_with_min_lr"},
        "training.lr_scheduler_kwargs: needs exactly one of min_lr, min_lr_rate with lr_scheduler_type: cosine_with_min_lr; got min_lr, min_lr_rate",
    ),
    (
        "dpo",
        {"accelerator_config": {"split_batch": True}},
        "training.accelerator_config.split_batch: unknown key; did you mean training.accelerator_config.split_batches? (the fields of transformers' AcceleratorConfig)",
    ),
    # generation_kwargs: the keys of what generates (transformers' GenerationConfig, vLLM's SamplingParams or requests)
    (
        "grpo",
        {"generation_kwargs": {"temprature": 0.5}},
        "training.generation_kwargs.temprature: unknown key; did you mean training.generation_kwargs.temperature? (without vLLM they go to transformers' GenerationConfig, which keeps any other key, and generate ignores it)",
    ),
    (
        "rloo",
        {"generation_kwargs": {"max_tokens": 8}},
        "training.generation_kwargs.max_tokens: unknown key; did you mean training.generation_kwargs.max_new_tokens?",
    ),
    (
        "grpo",
        {"generation_kwargs": {"max_new_tokens": 8}, "use_vllm": True},
        "training.generation_kwargs.max_new_tokens: unknown key; did you mean training.generation_kwargs.max_tokens? (colocated vLLM makes its SamplingParams of them",
    ),
    (
        "distill",
        {"generation_kwargs": {"do_sample": True}, "use_vllm": True, "vllm_mode": "server"},
        "training.generation_kwargs.do_sample: unknown key; the nearest of the 52 valid keys here",
    ),
    (
        "sft",
        {"dataset_kwargs": {"skip_prepare_dataset": True}},
        "training.dataset_kwargs: not supported by posttrain.sft; the data is text, messages or prompt and completion",
    ),
    # values that do nothing with others (tests/unit/job/test_runtime.py builds the trainer with them)
    (
        "grpo",
        {"vllm_mode": "server"},
        "training.vllm_mode: server does nothing with use_vllm: false (TRL's default); set use_vllm: true, or drop it (TRL generates with transformers' generate then",
    ),
    (
        "rloo",
        {"vllm_server_base_url": "http://vllm:8000", "use_vllm": True},
        "training.vllm_server_base_url: http://vllm:8000 does nothing with use_vllm: true, vllm_mode: colocate (TRL's default); set vllm_mode: server, or drop it",
    ),
    (
        "online_dpo",
        {"vllm_tensor_parallel_size": 2, "use_vllm": True, "vllm_mode": "server"},
        "training.vllm_tensor_parallel_size: 2 does nothing with use_vllm: true, vllm_mode: server; set vllm_mode: colocate, or drop it",
    ),
    (
        "sft",
        {"eval_steps": 5},
        "training.eval_steps: 5 does nothing with eval_strategy: 'no' (TRL's default); set eval_strategy: steps, or drop it",
    ),
    (
        "dpo",
        {"save_steps": 20, "save_strategy": "epoch"},
        "training.save_steps: 20 does nothing with save_strategy: epoch; set save_strategy: steps",
    ),
    (
        "sft",
        {"logging_steps": 1, "logging_strategy": "epoch"},
        "training.logging_steps: 1 does nothing with logging_strategy: epoch, eval_strategy: 'no' (TRL's default); set logging_strategy: steps",
    ),
    # Liger's fused cross-entropy in a trainer that fuses the LM head itself (SFT: Liger on by default on GPUs)
    (
        "sft",
        {"liger_kernel_config": {"fused_linear_cross_entropy": True}},
        "training.liger_kernel_config: fused_linear_cross_entropy: true cannot go with Liger kernels (on by default on GPUs) in trl:SFTTrainer",
    ),
    (
        "grpo",
        {"liger_kernel_config": {"fused_linear_cross_entropy": True}, "use_liger_kernel": True},
        "training.liger_kernel_config: fused_linear_cross_entropy: true cannot go with Liger kernels in trl:GRPOTrainer",
    ),
    (
        "dpo",
        {"liger_kernel_config": {"fused_linear_cross_entropy": True}, "use_liger_kernel": True},
        "training.liger_kernel_config: fused_linear_cross_entropy: true cannot go with Liger kernels in trl:DPOTrainer",
    ),
    (
        "sft",
        {"activation_checkpointing_kwargs": {"selective": True}, "activation_checkpointing": False},
        "training.activation_checkpointing_kwargs: selective: true cannot go with activation_checkpointing: false",
    ),
]


@pytest.mark.parametrize(
    "algorithm, training, message", BAD_VALUES, ids=[f"{a}-{next(iter(t))}" for a, t, _ in BAD_VALUES]
)
def test_bad_values_name_the_key_the_value_and_what_is_allowed(algorithm: str, training: dict, message: str) -> None:
    with pytest.raises(SpecError) as error:
        validate(spec_with(algorithm, **training))
    (line,) = [p for p in error.value.problems if p.startswith(f"training.{next(iter(training))}")]
    assert line.startswith(message) and "\n" not in line


VALID_VALUES = [
    ("dpo", {"loss_type": "ipo"}),
    ("dpo", {"loss_type": ["sigmoid", "sft"], "loss_weights": [0.8, 0.2]}),
    ("grpo", {"scale_rewards": False}),
    ("grpo", {"scale_rewards": True}),
    ("grpo", {"scale_rewards": "batch"}),
    ("grpo", {"loss_type": "dr_grpo", "importance_sampling_level": "sequence"}),
    ("online_dpo", {"beta": 0.1}),
    ("online_dpo", {"beta": [0.1, 0.05]}),
    ("online_dpo", {"loss_type": "ipo"}),
    ("distill", {"beta": 0.5}),
    ("sft", {"loss_type": "dft"}),
    ("kto", {"loss_type": "apo_zero_unpaired"}),
    ("grpo", {"sync_ref_model": True, "beta": 0.04}),
    ("dpo", {"loss_type": "exo_pair", "label_smoothing": 1e-3}),
    ("dpo", {"loss_type": "ipo", "f_divergence_type": "js_divergence"}),
    ("sft", {"padding_free": True, "max_length": None}),
    ("sft", {"padding_free": True, "packing": True, "max_length": 64}),
    (
        "sft",
        {"activation_checkpointing": True, "activation_checkpointing_kwargs": {"selective": True, "every_n_layers": 2}},
    ),
    ("reward", {"gradient_checkpointing_kwargs": {"every_n_layers": 2, "offload": False}}),
    ("ppo", {"activation_checkpointing_kwargs": {"every_n_layers": 2, "use_reentrant": False}}),
    ("sft", {"lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr_rate": 0.1}}),
    ("dpo", {"lr_scheduler_type": "warmup_stable_decay", "lr_scheduler_kwargs": {"num_decay_steps": 5}}),
    ("dpo", {"activation_checkpointing_kwargs": {"use_reentrant": False, "preserve_rng_state": False}}),
    # Liger off: TRL never reads it
    ("dpo", {"liger_kernel_config": {"fused_linear_cross_entropy": True}}),
    ("grpo", {"generation_kwargs": {"top_k": 5, "min_new_tokens": 2}}),
    ("dpo", {"optim": "sgd", "optim_args": "momentum=0.9,nesterov=true"}),
    ("grpo", {"use_vllm": True, "vllm_mode": "server", "vllm_gpu_memory_utilization": 0.5, "vllm_server_port": 8001}),
    ("distill", {"use_vllm": True, "vllm_tensor_parallel_size": 1, "vllm_enable_sleep_mode": True}),
    # null: not given
    ("sft", {"eval_strategy": "no", "eval_steps": None}),
    # no arguments, as transformers reads it
    ("sft", {"optim_args": ""}),
    ("online_dpo", {"generation_kwargs": {"max_tokens": 8, "seed": 1}, "use_vllm": True}),
    ("rloo", {"generation_kwargs": {"max_tokens": 8, "vllm_xargs": {"a": 1}}, "use_vllm": True, "vllm_mode": "server"}),
]


@pytest.mark.parametrize("algorithm, training", VALID_VALUES, ids=[f"{a}-{t}" for a, t in VALID_VALUES])
def test_values_trl_accepts_are_accepted_by_the_validator_and_by_trl(
    tmp_path: Path, algorithm: str, training: dict
) -> None:
    from posttrain.entrypoints.inputs.models import import_object

    spec = validate(spec_with(algorithm, **training))
    # accepted as given
    assert {key: spec.training[key] for key in training} == training
    kwargs = {**spec.training, "output_dir": str(tmp_path), "use_cpu": True, "report_to": "none"}
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    # and TRL's own __post_init__ checks pass
    import_object(spec.config_class)(**kwargs)


def test_a_combination_names_the_default_it_meets() -> None:
    with pytest.raises(SpecError) as error:
        validate(spec_with("dpo", loss_type="exo_pair"))
    assert error.value.problems == [
        "training.label_smoothing: 0.0 (TRL's default) cannot go with loss_type: exo_pair; expected label_smoothing "
        "> 0 (EXO needs it above 0; its paper uses 1e-3)"
    ]


def test_exponents_written_in_a_yaml_file_are_numbers(tmp_path: Path) -> None:
    """YAML 1.1 reads 1e-5 as text; for a field that takes a number and not text it is the number."""
    text = (REPO / "templates/sft/tiny.yaml").read_text().replace("learning_rate: 3.0e-3", "learning_rate: 3e-3")
    (tmp_path / "spec.yaml").write_text(text + "  adam_epsilon: 1e-6\n")
    training = load_spec(str(tmp_path / "spec.yaml")).training
    assert training["learning_rate"] == 3e-3 and training["adam_epsilon"] == 1e-6


def test_no_written_in_a_yaml_file_is_the_choice_no(tmp_path: Path) -> None:
    """YAML 1.1 reads no as false: for a field that takes choices and not a boolean it is the choice 'no'."""
    text = (REPO / "templates/sft/tiny.yaml").read_text().replace("  save_steps: 20\n", "")
    assert yaml.safe_load("eval_strategy: no") == {"eval_strategy": False}
    (tmp_path / "spec.yaml").write_text(text + "  eval_strategy: no\n  save_strategy: no\n  logging_first_step: no\n")
    training = load_spec(str(tmp_path / "spec.yaml")).training
    assert (training["eval_strategy"], training["save_strategy"], training["logging_first_step"]) == ("no", "no", False)
    # no choice is spelt yes
    (tmp_path / "spec.yaml").write_text(text + "  eval_strategy: yes\n")
    with pytest.raises(SpecError, match="training.eval_strategy: expected one of 'no', 'steps', 'epoch'; got True"):
        load_spec(str(tmp_path / "spec.yaml"))


def test_exponents_in_posttrain_sections_are_numbers_too(tmp_path: Path) -> None:
    # a reward's weight: posttrain's own field, in a list of sections
    text = (REPO / "templates/grpo/tiny.yaml").read_text()
    assert "  - builtin: contains\n" in text
    text = text.replace("  - builtin: contains\n", "  - builtin: contains\n    weight: 5e-1\n", 1)
    (tmp_path / "spec.yaml").write_text(text)
    spec = load_spec(str(tmp_path / "spec.yaml"))
    assert spec.rewards[0].weight == 0.5


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda t: t.replace("  max_steps: 40\n", "  max_steps: 40\n  max_steps: 50\n"),
            "at line 14, column 3: key 'max_steps' is given twice in one mapping",
        ),
        (lambda t: t.replace("algorithm: sft", "algorithm: sft\nmodel: [oops"), "is not valid YAML at line"),
    ],
)
def test_yaml_mistakes_are_one_line_with_their_place(tmp_path: Path, edit: Any, message: str) -> None:
    (tmp_path / "spec.yaml").write_text(edit((REPO / "templates/sft/tiny.yaml").read_text()))
    with pytest.raises(SpecError) as error:
        load_spec(str(tmp_path / "spec.yaml"))
    assert message in str(error.value) and "\n" not in str(error.value)


SPEC_MISTAKES = [
    (
        {"training": {"output_dir": ""}},
        "training.output_dir: required; the directory the job writes the model and checkpoints to; got ''",
    ),
    ({"training": {"output_dir": None}}, "training.output_dir: required"),
    (
        {"model": {"name_or_path": " "}},
        "model.name_or_path: expected a path, a hub id or builtin:tiny-llama; got an empty string",
    ),
    ({"reference_model": ""}, "reference_model: expected a path or hub id; got an empty string"),
    (
        {"data": {"train": {"path": "templates/data/preference.jsonl", "split": "test"}}},
        "data.train.split: 'test' applies to hub data sets (data.train.name); a local file is one split: remove it",
    ),
    ({"resume": "atuo"}, "resume: 'atuo' is neither auto nor never; did you mean auto?"),
]


@pytest.mark.parametrize("change, message", SPEC_MISTAKES)
def test_spec_mistakes(change: dict, message: str) -> None:
    raw = load_template("dpo/tiny.yaml")
    for key, value in change.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) and isinstance(raw.get(key), dict) else value
    with pytest.raises(SpecError) as error:
        validate(raw)
    assert any(problem.startswith(message) for problem in error.value.problems), error.value.problems


def test_an_unclosed_list_in_an_override_is_refused() -> None:
    with pytest.raises(
        SpecError, match=r"override 'model.lora.target_modules=\[q_proj, v_proj': .* not YAML flow syntax"
    ):
        algorithms.sft("model.lora.target_modules=[q_proj, v_proj", spec=f"{REPO}/templates/sft/tiny.yaml")


def test_elastic_j_is_checked_at_every_node_count() -> None:
    """A generation batch that divides at 2 nodes but not at 1: refused, naming the node count."""
    overrides = ["training.per_device_train_batch_size=3", "training.num_generations=6"]
    algorithms.grpo(*overrides, spec=f"{REPO}/templates/grpo/tiny.yaml", j="2x1")
    with pytest.raises(
        SpecError, match=r"training.num_generations: the generation batch \(3 = .*\(at 1 nodes of -j 1:2x1\)"
    ):
        algorithms.grpo(*overrides, spec=f"{REPO}/templates/grpo/tiny.yaml", j="1:2x1")


@pytest.mark.parametrize(
    "args, message",
    [
        (
            {"min_chars": "ten", "max_chars": 20},
            "rewards.0.builtin: length_band.min_chars: expected an integer; got 'ten'",
        ),
        ({"target": 5}, "rewards.0.builtin: contains.target: expected a string or null; got 5"),
    ],
)
def test_builtin_reward_arguments_of_the_wrong_type(args: dict, message: str) -> None:
    raw = load_template("grpo/tiny.yaml")
    raw["rewards"] = [{"builtin": "length_band" if "min_chars" in args else "contains", "args": args}]
    with pytest.raises(SpecError) as error:
        validate(raw)
    assert message in str(error.value)


def test_unknown_keys_list_the_nearest_few_valid_keys_not_all() -> None:
    with pytest.raises(SpecError) as error:
        validate(spec_with("grpo", zzz_unheard_of=1))
    (line,) = error.value.problems
    assert line.startswith("training.zzz_unheard_of: unknown key; the nearest of the ") and line.count(",") == 4


def test_the_shipped_table_loads_as_yaml() -> None:
    # PyYAML's own loader
    entries = yaml.safe_load((values.RULES_DIR / "trl-1.16.yaml").read_text())
    assert all(("field" in entry) != ("fields" in entry) for entry in entries)
    assert [row for entry in entries for row in values._per_field(entry)] == list(rules())
    old_name = [row for row in rules() if row["field"] == "gradient_checkpointing_kwargs"]
    assert [{**row, "field": "activation_checkpointing_kwargs"} for row in old_name] == [
        row for row in rules() if row["field"] == "activation_checkpointing_kwargs"
    ]


def test_the_mapping_keys_are_those_the_installed_packages_take() -> None:
    """Fails when torch's checkpoint, transformers' checkpointing helper or AcceleratorConfig change their options."""
    import dataclasses
    import inspect

    import torch.utils.checkpoint
    from transformers import PreTrainedModel
    from transformers.trainer_pt_utils import AcceleratorConfig

    keys = {(row["field"], tuple(row.get("configs", ()))): row["keys"] for row in rules() if "keys" in row}
    passed = {"function", "args", "kwargs"}
    torch_options = set(inspect.signature(torch.utils.checkpoint.checkpoint).parameters) - passed
    helper_options = set(inspect.signature(PreTrainedModel.activation_checkpointing_enable).parameters)
    for field in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"):
        # context_fn takes a function, which YAML cannot give; preserve_rng_state is read from **kwargs
        assert set(keys[field, ()]) == torch_options - {"context_fn"} | {"preserve_rng_state"}
        trainer_keys = [k for (name, configs), k in keys.items() if name == field and "trl:RewardConfig" in configs]
        assert trainer_keys == [["every_n_layers", "offload"]] and {"every_n_layers", "offload"} <= helper_options
    assert keys["accelerator_config", ()] == [field.name for field in dataclasses.fields(AcceleratorConfig)]
    # what the job met before
    with pytest.raises(TypeError, match="unexpected keyword argument 'split_batch'"):
        AcceleratorConfig(split_batch=True)


def test_warmup_is_refused_with_the_schedules_transformers_makes_without_it() -> None:
    """Fails when transformers' schedules start or stop taking warmup; shows what it did with warmup_steps."""
    import torch
    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION, get_scheduler

    (row,) = [row for row in rules() if row["field"] == "warmup_steps" and "requires" in row]

    def first_rates(schedule: str, warmup: int) -> list:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        kwargs = {"num_decay_steps": 5} if schedule == "warmup_stable_decay" else {}
        kwargs.update({"min_lr": 0.0} if "min_lr" in schedule else {})
        scheduler = get_scheduler(schedule, optimizer, warmup, 10, kwargs)
        rates = []
        for _ in range(3):
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            # a metric
            scheduler.step(*([1.0] if schedule in ("reduce_lr_on_plateau", "greedy") else []))
        return rates

    for schedule in [s.value for s in TYPE_TO_SCHEDULER_FUNCTION]:
        dropped = first_rates(schedule, warmup=5) == first_rates(schedule, warmup=0)
        assert dropped == (schedule in row["when"]["lr_scheduler_type"]), schedule
    with pytest.raises(
        SpecError, match="training.warmup_steps: 5 cannot go with lr_scheduler_type: constant; expected 0"
    ):
        validate(spec_with("sft", warmup_steps=5))
    validate(spec_with("sft", warmup_steps=5, lr_scheduler_type="constant_with_warmup"))
    # 0.0, as an override writes it, is no warmup too
    validate(spec_with("sft", warmup_steps=0.0))


def test_optim_args_are_refused_where_transformers_cannot_parse_or_never_reads_them(tmp_path: Path) -> None:
    """Fails when transformers' optimizers start or stop reading optim_args, or parse them otherwise; shows what it
    did with them."""
    import inspect

    from transformers import Trainer, TrainingArguments
    from transformers.trainer_optimizer import _OPTIMIZER_HANDLERS, _parse_optim_args

    (row,) = [row for row in rules() if row["field"] == "optim_args" and "when" in row]
    handlers = _OPTIMIZER_HANDLERS.items()
    never_read = [name.value for name, handler in handlers if "optim_args" not in inspect.getsource(handler)]
    assert sorted(row["when"]["optim"]) == sorted(never_read)
    args = TrainingArguments(str(tmp_path), optim="adamw_torch", optim_args="eps=1e-6", use_cpu=True)
    _, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    # dropped without a word
    assert kwargs["eps"] == args.adam_epsilon != 1e-6
    (pattern,) = [row["pattern"] for row in rules() if "pattern" in row]
    for text in ("momentum=0.9", "momentum=0.9, nesterov=true", "", "betas=(0.9,0.95)", "momentum", "a=1,,b=2"):
        try:
            parsed = _parse_optim_args(text)
        except ValueError:
            # what the job met when the optimizer was made
            parsed = None
        assert (re.fullmatch(pattern, text) is not None) == (parsed is not None), text


def test_generation_keys_without_vllm_are_generation_configs_fields() -> None:
    """Fails when transformers' GenerationConfig changes its fields (vLLM's: tests/e2e/test_vllm.py)."""
    from transformers import GenerationConfig

    (row,) = [row for row in rules() if row["field"] == "generation_kwargs" and row["when"] == {"use_vllm": False}]
    fields = {key for key in vars(GenerationConfig()) if not key.startswith("_")} - {"transformers_version"}
    assert set(row["keys"]) == fields
    # what TRL built before: kept, then ignored
    typo = GenerationConfig(temprature=0.01, do_sample=True)
    typo.validate()
    assert typo.temprature == 0.01 and typo.temperature is None


def test_the_schedule_options_are_those_transformers_hands_each_schedule() -> None:
    """Fails when transformers' schedules change their options; shows what it does with the ones refused."""
    import inspect

    import torch
    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION, get_scheduler

    rows = [row for row in rules() if row["field"] == "lr_scheduler_kwargs"]
    given_by_transformers = {"optimizer", "num_warmup_steps", "num_training_steps"}
    covered = set()
    for row in rows:
        schedules = row["when"]["lr_scheduler_type"]
        for schedule in schedules if isinstance(schedules, list) else [schedules]:
            parameters = set(inspect.signature(TYPE_TO_SCHEDULER_FUNCTION[schedule]).parameters)
            expected = set() if schedule.startswith("constant") else parameters - given_by_transformers
            assert set(row["keys"]) == expected, schedule
            covered.add(schedule)
    # the rest take any keyword (plateau, greedy)
    for schedule, function in TYPE_TO_SCHEDULER_FUNCTION.items():
        kinds = {p.kind for p in inspect.signature(function).parameters.values()}
        assert schedule.value in covered or inspect.Parameter.VAR_KEYWORD in kinds, schedule.value
    with pytest.raises(SpecError, match="lr_scheduler_kwargs: needs num_decay_steps with lr_scheduler_type: warmup"):
        # no lr_scheduler_kwargs at all
        validate(spec_with("dpo", lr_scheduler_type="warmup_stable_decay"))
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(TypeError, match="min_lr_rate"):
        get_scheduler("linear", optimizer, 0, 10, {"min_lr_rate": 0.1})
    with pytest.raises(ValueError, match="One of min_lr or min_lr_rate should be set"):
        get_scheduler("cosine_with_min_lr", optimizer, 0, 10, {})
    with pytest.raises(TypeError, match="num_decay_steps"):
        get_scheduler("warmup_stable_decay", optimizer, 0, 10, {})
    # dropped without a word
    get_scheduler("constant_with_warmup", optimizer, 0, 10, {"num_cycles": 3})


# Each stands for a class of input the client let through before (issue 30): non-finite numbers anywhere, columns
# renamed onto one name, batches TRL's config divides, options TRL's generating configs refuse, coefficients whose
# sign reverses their term, lists that pair item by item with another field, and echoes of what a user wrote.
LAST_VALUES = [
    (
        "grpo",
        {"rewards": [{"builtin": "contains", "args": {"target": "blue"}, "weight": float("nan")}]},
        "rewards.0.weight: input should be a finite number; got nan",
    ),
    ("sft", {"training": {"learning_rate": float("inf")}}, "training.learning_rate: .inf is not a finite number"),
    (
        "grpo",
        {"training": {"generation_kwargs": {"temperature": float("nan")}}},
        "training.generation_kwargs: {temperature: .nan} holds a number that is not finite",
    ),
    (
        "dpo",
        {"data": {"train": {"path": "templates/data/preference.jsonl"}, "columns": {"a": "prompt", "b": "prompt"}}},
        "data.columns: a, b are all renamed to prompt; rename one to each name",
    ),
    (
        "grpo",
        {
            "data": {"eval": {"path": "templates/data/prompts.jsonl"}},
            "training": {"eval_strategy": "steps", "eval_steps": 5, "per_device_eval_batch_size": 3},
        },
        "training.per_device_eval_batch_size: the evaluation batch (3 per device x 2 processes = 6) must divide by "
        "num_generations (8); use a multiple of 4",
    ),
    ("grpo", {"training": {"auto_find_batch_size": True}}, "training.auto_find_batch_size: true is not taken here"),
    ("rloo", {"training": {"auto_find_batch_size": True}}, "training.auto_find_batch_size: true is not taken here"),
    (
        "reward",
        {"training": {"center_rewards_coefficient": -0.01}},
        "training.center_rewards_coefficient: -0.01 is out of range; expected center_rewards_coefficient >= 0",
    ),
    (
        "dpo",
        {"training": {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0]}},
        "training.loss_weights: 1 values for 2 in loss_type ([sigmoid, sft]); give one per item",
    ),
    (
        "dpo",
        {"training": {"loss_weights": [1.0, 0.5]}},
        "training.loss_weights: 2 values for 1 in loss_type ([sigmoid])",
    ),
    ("sft", {"training": {"x" * 3000: 1}}, f"training.{'x' * 80}... (3000 characters): unknown key"),
]


@pytest.mark.parametrize("algorithm, change, message", LAST_VALUES, ids=[m.split(":")[0] for _, _, m in LAST_VALUES])
def test_the_last_values_the_client_let_through_are_one_line_each(algorithm: str, change: dict, message: str) -> None:
    raw = load_template(f"{algorithm}/tiny.yaml")
    for key, value in change.items():
        raw[key] = {**raw[key], **value} if isinstance(value, dict) and isinstance(raw.get(key), dict) else value
    with pytest.raises(SpecError) as error:
        validate(raw, world_size=2)
    assert len(error.value.problems) == 1 and error.value.problems[0].startswith(message), error.value.problems
    assert len(error.value.problems[0]) < 400


@pytest.mark.parametrize(
    "training",
    [
        {"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5]},
        {"loss_weights": [2.0]},
        {"center_rewards_coefficient": 0.01},
    ],
)
def test_the_same_keys_with_values_trl_takes_pass(tmp_path: Path, training: dict) -> None:
    from posttrain.entrypoints.inputs.models import import_object

    algorithm = "reward" if "center_rewards_coefficient" in training else "dpo"
    spec = validate(spec_with(algorithm, **training))
    # accepted as given
    assert {key: spec.training[key] for key in training} == training
    config = import_object(spec.config_class)(**{**spec.training, "output_dir": str(tmp_path), "use_cpu": True})
    # and TRL keeps them
    assert all(getattr(config, key) == value for key, value in training.items())
