"""The spec: validation messages, overrides with types, and the JSON round trip."""

import inspect
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml

from golden_messages import (
    BF16_AND_FP16,
    DATA_KEY_TYPO,
    KEY_IN_THE_WRONG_SECTION,
    MINI_BATCHES_NOT_DIVIDING,
    MODEL_KEY_TYPO,
    NOT_A_BOOLEAN,
    NOT_A_NUMBER,
    PPO_WITH_LORA,
    REFERENCE_WITH_LORA,
    REWARD_WEIGHTS_ARE_OWNED,
    TYPO_MESSAGE,
    UNKNOWN_VLLM_MODE,
    VLLM_MODE_WITHOUT_VLLM,
    ZERO_STEPS,
    ZERO_TIMEOUT,
)
from helpers import TEMPLATES, load_template
from posttrain.components.spec.fields import config_fields
from posttrain.components.spec.loading import load_spec, spec_from_json, validate
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.overrides import apply_overrides
from posttrain.components.spec.registry import SPEC_CLASSES

# one algorithm's spec each (a chain's are tests/unit/components/test_chain.py's, an evaluation's
# tests/unit/spec/test_eval_spec.py's)
ALL_TEMPLATES = sorted(
    str(p.relative_to(TEMPLATES)) for p in TEMPLATES.glob("*/*.yaml") if p.parent.name not in ("chain", "eval")
)


def tiny_sft() -> Dict[str, Any]:
    return load_template("sft/tiny.yaml")


def problems_of(raw: Dict[str, Any], **kwargs: Any) -> str:
    with pytest.raises(SpecError) as error:
        validate(raw, **kwargs)
    return str(error.value)


@pytest.mark.parametrize("template", ALL_TEMPLATES)
def test_every_template_validates_and_round_trips(template: str) -> None:
    spec = load_spec(str(TEMPLATES / template))
    again = spec_from_json(spec.to_json())
    assert again == spec
    assert again.to_json() == spec.to_json()


@pytest.mark.parametrize("template", ALL_TEMPLATES)
def test_every_template_opens_with_the_command_that_runs_it(template: str) -> None:
    # the first line is the editor's schema modeline (tests/unit/generate/test_schema_json.py); the command comes next
    lines = (TEMPLATES / template).read_text().splitlines()
    first_line = next((line for line in lines if line.startswith("# torchx run")), lines[0])
    algorithm = load_template(template)["algorithm"]
    assert first_line.startswith("# torchx run -s "), first_line
    assert f"posttrain.{algorithm} --spec templates/{template}" in first_line


@pytest.mark.parametrize("algorithm", sorted(SPEC_CLASSES))
def test_the_registry_names_what_the_job_imports(algorithm: str) -> None:
    """Each algorithm's description resolves: its config and trainer import, its fields are tabled, it ships a template."""
    import dataclasses
    import importlib
    import os

    import transformers

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    cls = SPEC_CLASSES[algorithm]

    def imported(path: str) -> type:
        module, _, attr = path.partition(":")
        return getattr(importlib.import_module(module), attr)

    config = imported(cls.config_class)
    assert issubclass(config, transformers.TrainingArguments)
    assert {f.name for f in dataclasses.fields(config) if f.init} == set(config_fields(cls.config_class))
    trainer = imported(cls.trainer_name())
    # posttrain's own PPO loop
    assert issubclass(trainer, transformers.Trainer) or algorithm == "ppo"
    source = inspect.getsource(importlib.import_module(f"posttrain.entrypoints.{algorithm}"))
    assert f"return {trainer.__name__}(" in source, "the entrypoint calls its trainer's constructor, in plain sight"
    assert ("reward_funcs" in inspect.signature(trainer).parameters) == ("rewards" in cls.model_fields)
    assert hasattr(transformers, cls.model_class)
    assert cls.data_formats and all(cls.data_formats)
    assert set(cls.extra_models) <= set(cls.model_fields), "each extra model is a spec field"
    assert cls.groups <= cls.generates and ("rewards" in cls.model_fields) <= cls.generates
    assert (TEMPLATES / algorithm / "tiny.yaml").is_file()
    assert importlib.util.find_spec(f"posttrain.entrypoints.{algorithm}") is not None


def test_training_is_checked_against_the_algorithms_own_config() -> None:
    raw = load_template("dpo/tiny.yaml")
    # beta is a DPOConfig field
    validate(raw)
    # an SFTConfig field
    raw["training"]["packing"] = True
    assert "training.packing: unknown key" in problems_of(raw)


def test_reference_model_and_lora_are_exclusive() -> None:
    raw = load_template("dpo/tiny.yaml")
    raw["reference_model"] = "some/model"
    validate(raw)
    raw["model"]["lora"] = {"r": 8}
    assert REFERENCE_WITH_LORA in problems_of(raw)


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (("training", "learnig_rate"), 1.0, TYPO_MESSAGE),
        (("model", "dtyp"), "auto", MODEL_KEY_TYPO),
        (("data", "train", "paht"), "x", DATA_KEY_TYPO),
        (
            ("model", "learning_rate"),
            1.0,
            KEY_IN_THE_WRONG_SECTION,
        ),
        (("training", "lora"), {}, "training.lora: unknown key here; it belongs at model.lora"),
        (("model", "lora"), {"rank": 8}, "model.lora.rank: unknown key"),
        (("trainig",), {}, "trainig: unknown key; did you mean training?"),
    ],
)
def test_unknown_keys_name_the_nearest_valid_key(path: tuple, value: Any, expected: str) -> None:
    raw = tiny_sft()
    node = raw
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    assert expected in problems_of(raw)


@pytest.mark.parametrize("algorithm", sorted(SPEC_CLASSES))
def test_parallelism_config_is_refused_by_every_algorithm_not_passed_on_unchecked(algorithm: str) -> None:
    raw = {**tiny_sft(), "algorithm": algorithm}
    raw["training"] = {"output_dir": "out", "parallelism_config": {"cp_size": 2}}
    assert f"training.parallelism_config: not supported by posttrain.{algorithm}; " in problems_of(raw)


@pytest.mark.parametrize(
    "key, hint",
    [
        ("deepspeed", "use distributed.deepspeed"),
        ("fsdp", "use distributed.fsdp"),
        ("use_cpu", "posttrain sets it from the hardware"),
        ("ddp_timeout", "use distributed.timeout_s"),
        ("resume_from_checkpoint", "use resume"),
        ("hub_token", "HF_TOKEN environment variable"),
    ],
)
def test_owned_keys_point_to_the_right_place(key: str, hint: str) -> None:
    raw = tiny_sft()
    raw["training"][key] = "x"
    message = problems_of(raw)
    assert f"training.{key}: set by posttrain, not in training" in message
    assert hint in message


@pytest.mark.parametrize(
    "section, key, value, expected",
    [
        ("training", "learning_rate", "fast", NOT_A_NUMBER),
        ("training", "max_steps", 2.5, "training.max_steps: expected an integer; got 2.5"),
        ("training", "bf16", "yes", "training.bf16: expected true/false or null; got 'yes'"),
        ("training", "lr_scheduler_type", "cosin", "did you mean 'cosine'?"),
        (
            "training",
            "per_device_train_batch_size",
            0,
            "training.per_device_train_batch_size: 0 is out of range; expected per_device_train_batch_size >= 1",
        ),
        (
            "training",
            "learning_rate",
            -1e-5,
            "training.learning_rate: -1e-05 is out of range; expected learning_rate > 0",
        ),
        ("training", "max_steps", 0, ZERO_STEPS),
        ("model", "dtype", "bf16", "model.dtype: input should be 'auto', 'float32', 'bfloat16' or 'float16'"),
        ("model", "trust_remote_code", "yes", NOT_A_BOOLEAN),
        ("model", "lora", {"r": "eight"}, "model.lora.r: expected an integer; got 'eight'"),
        ("distributed", "timeout_s", 0, ZERO_TIMEOUT),
    ],
)
def test_wrong_types_and_values_name_key_and_expectation(section: str, key: str, value: Any, expected: str) -> None:
    raw = tiny_sft()
    raw.setdefault(section, {})[key] = value
    assert expected in problems_of(raw)


def test_all_problems_are_reported_together() -> None:
    raw = tiny_sft()
    raw["training"].update(learning_rate="fast", per_device_train_batch_size=0)
    raw["model"]["dtype"] = "bf16"
    lines = problems_of(raw).splitlines()
    assert len(lines) == 3, lines


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"training": {"bf16": True, "fp16": True}}, BF16_AND_FP16),
        ({"model": {"dtype": "float16"}, "training": {"bf16": True}}, "model.dtype: float16 contradicts training.bf16"),
        ({"data": {"train": {"path": "a.jsonl", "name": "hub/set"}}}, "data.train: give exactly one of path"),
        ({"data": {"train": {"split": "train"}}}, "data.train: give exactly one of path"),
        # what transformers' Trainer refuses only once the models are loaded
        (
            {"training": {"save_strategy": "best", "eval_strategy": "steps"}},
            "training.save_strategy: best keeps the checkpoint with the best",
        ),
        (
            {"distributed": {"deepspeed": {"zero_stage": 3}}, "training": {"auto_find_batch_size": True}},
            "training.auto_find_batch_size: transformers does not support it with ZeRO-3",
        ),
        (
            {"distributed": {"fsdp": {}}, "training": {"save_only_model": True}},
            "training.save_only_model: distributed.fsdp saves sharded checkpoints",
        ),
        (
            {
                "distributed": {"deepspeed": {"zero_stage": 2}},
                "training": {"save_only_model": True, "load_best_model_at_end": True},
            },
            "training.save_only_model: with distributed.deepspeed the best model cannot be loaded",
        ),
    ],
)
def test_impossible_combinations(change: Dict[str, Any], expected: str) -> None:
    raw = tiny_sft()
    for section, values in change.items():
        if section == "data":
            raw["data"] = {"train": values["train"]}
        else:
            raw.setdefault(section, {}).update(values)
    assert expected in problems_of(raw)


def test_eval_data_the_trainer_never_evaluates_on_is_refused() -> None:
    raw = tiny_sft()
    raw["data"]["eval"] = raw["data"]["train"]
    assert problems_of(raw) == (
        "data.eval: the trainer never evaluates with eval_strategy: no (TRL's default); set "
        "eval_strategy: steps (every eval_steps) or epoch, or eval_on_start: true, or drop "
        "data.eval"
    )
    # transformers evaluates once before training, whatever the strategy
    raw["training"]["eval_on_start"] = True
    validate(raw)
    assert problems_of({**raw, "data": {"train": raw["data"]["train"]}}) == (
        "training.eval_on_start: true evaluates on data.eval before training, which the spec does not give; add "
        "data.eval, or drop eval_on_start"
    )
    del raw["training"]["eval_on_start"]
    raw["training"].update(eval_strategy="steps", eval_steps=10)
    assert validate(raw).data.eval is not None


def test_missing_sections_and_output_dir_are_required() -> None:
    assert "model: required" in problems_of({"algorithm": "sft", "data": {"train": {"path": "x"}}, "training": {}})
    raw = tiny_sft()
    del raw["training"]["output_dir"]
    assert "training.output_dir: required" in problems_of(raw)


def test_a_spec_for_another_algorithm_is_refused() -> None:
    raw = tiny_sft()
    message = problems_of(raw, algorithm="dpo")
    assert "this spec is for 'sft' but was given to posttrain.dpo" in message
    raw["algorithm"] = "sftt"
    assert "algorithm: unknown 'sftt'; expected one of" in problems_of(raw)


def test_overrides_convert_by_the_type_of_the_field() -> None:
    raw = tiny_sft()
    result = apply_overrides(
        raw,
        [
            "training.learning_rate=1e-5",
            "training.max_steps=7",
            "training.bf16=false",
            "training.report_to=[tensorboard, wandb]",
            'training.run_name=it\'s a "quoted" name; $(echo hi) `x` ü',
            "training.lr_scheduler_type=cosine_with_min_lr",
            "training.lr_scheduler_kwargs={min_lr: 0.1}",
            "model.revision=0123",
            "model.lora.target_modules=[q_proj, v_proj]",
            "model.lora.r=8",
            "distributed.timeout_s=60",
            "resume=never",
        ],
    )
    training = result["training"]
    assert training["learning_rate"] == 1e-5 and isinstance(training["learning_rate"], float)
    assert training["max_steps"] == 7 and training["bf16"] is False
    assert training["report_to"] == ["tensorboard", "wandb"]
    assert training["run_name"] == 'it\'s a "quoted" name; $(echo hi) `x` ü'
    assert training["lr_scheduler_kwargs"] == {"min_lr": 0.1}
    # a string field keeps the raw text
    assert result["model"]["revision"] == "0123"
    assert result["model"]["lora"] == {"target_modules": ["q_proj", "v_proj"], "r": 8}
    # a missing section is created
    assert result["distributed"] == {"timeout_s": 60}
    assert result["resume"] == "never"
    assert raw == tiny_sft(), "the input mapping must not be modified"
    validate(result)


def test_an_override_value_keeps_equals_signs_and_spaces() -> None:
    result = apply_overrides(tiny_sft(), ["training.run_name= a=b c "])
    assert result["training"]["run_name"] == " a=b c "


def test_a_removed_key_takes_its_default() -> None:
    raw = load_template("grpo/tiny-vllm-server.yaml")
    raw["training"]["output_dir"] = "out"
    with pytest.raises(SpecError, match=VLLM_MODE_WITHOUT_VLLM):
        validate(apply_overrides(raw, ["training.use_vllm=false"]))
    without = [
        "training.use_vllm=false",
        "~training.vllm_mode",
        "~training.vllm_gpu_memory_utilization",
        "~training.vllm_max_model_length",
    ]
    spec = validate(apply_overrides(raw, without))
    # a copy changed
    assert "vllm_mode" not in spec.training and raw["training"]["vllm_mode"] == "server"


@pytest.mark.parametrize(
    "override, expected",
    [
        ("training.max_steps", "expected key.path=value"),
        ("=3", "expected key.path=value"),
        ("training..max_steps=3", "empty key segment"),
        ("training.max_steps.x=3", "training.max_steps is a value, not a section"),
        ("-j=2x1", "go before the key.path=value overrides"),
        ("~training.use_vllm", "the spec has no training.use_vllm to remove"),
        ("~training.max_steps.x", "the spec has no training.max_steps.x to remove"),
        ("~training..max_steps", "empty key segment"),
        ("~", "expected ~key.path, which removes a key"),
        ("~training.max_steps=3", "expected ~key.path, which removes a key"),
        ("~data.train.path.0", "the spec has no data.train.path.0 to remove"),
        ("~data.train.path.x.y", "the spec has no data.train.path.x to remove"),
    ],
)
def test_malformed_overrides(override: str, expected: str) -> None:
    with pytest.raises(SpecError, match=expected.replace(".", r"\.")):
        apply_overrides(tiny_sft(), [override])


def test_an_override_of_the_wrong_type_is_reported_by_validation(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(tiny_sft()))
    with pytest.raises(SpecError, match="training.max_steps: expected an integer; got 'many'"):
        load_spec(str(path), ["training.max_steps=many"])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("model: [unclosed", "is not valid YAML"),
        ("- just\n- a list\n", "must hold a mapping of sections"),
    ],
)
def test_unreadable_spec_files(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=expected):
        load_spec(str(path))
    with pytest.raises(SpecError, match="no such file"):
        load_spec(str(tmp_path / "missing.yaml"))


def test_yaml_is_loaded_safely(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("algorithm: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(SpecError, match="is not valid YAML"):
        load_spec(str(path))


@pytest.mark.parametrize(
    "reward, expected",
    [
        ({"builtin": "contain", "args": {"target": "x"}}, "rewards.0.builtin: unknown built-in reward 'contain'"),
        ({"builtin": "contains", "args": {"taget": "x"}}, "rewards.0.builtin: contains: got an unexpected keyword"),
        ({"builtin": "contains", "args": {}}, "rewards.0.builtin: contains: give exactly one of target or column"),
        ({"builtin": "length_band", "args": {"min_chars": 9, "max_chars": 3}}, "expected 0 <= min_chars <= max_chars"),
        ({"builtin": "regex_format", "args": {"pattern": "("}}, "pattern is not a valid regular expression"),
        ({"function": "no_colon"}, "rewards.0.function: expected module:callable"),
        ({"function": "m:f", "model": "path"}, "rewards.0: give exactly one of function"),
        ({"model": "path", "args": {"a": 1}}, "rewards.0.args: only built-in rewards take args"),
        (
            {"builtin": "contains", "args": {"target": "x"}, "wieght": 2},
            "rewards.0.wieght: unknown key; did you mean rewards.0.weight?",
        ),
        ({"function": "m:f", "timeout_s": 0}, "rewards.0.timeout_s: expected seconds above 0 (unset: 600); got 0"),
        (
            {"builtin": "code_tests", "timeout_s": 30},
            "rewards.0.timeout_s: bounds a function's call, and a built-in bounds its own work (code_tests: "
            "args.timeout_s); drop it",
        ),
    ],
)
def test_rewards_are_checked_at_submit_time(reward: Dict[str, Any], expected: str) -> None:
    raw = load_template("grpo/tiny.yaml")
    raw["rewards"] = [reward]
    assert expected in problems_of(raw)


def test_online_algorithms_need_a_reward_and_own_reward_weights() -> None:
    raw = load_template("grpo/tiny.yaml")
    raw["rewards"] = []
    assert "rewards: give at least one reward" in problems_of(raw)
    raw = load_template("rloo/tiny.yaml")
    raw["training"]["reward_weights"] = [1.0]
    assert REWARD_WEIGHTS_ARE_OWNED in problems_of(raw)


def test_generation_batch_must_divide_by_num_generations_with_the_world_size_of_j() -> None:
    raw = load_template("grpo/tiny.yaml")
    raw["training"].update(per_device_train_batch_size=3, num_generations=8)
    message = problems_of(raw, world_size=2)
    assert "training.num_generations: the generation batch (6 = 3 per device x 2 processes x 1 steps)" in message
    assert "set num_generations to one of [2, 3, 6]" in message
    raw["training"].update(per_device_train_batch_size=4)
    validate(raw, world_size=2)
    raw["training"].update(generation_batch_size=12)
    assert (
        "generation_batch_size: 12 is not a multiple of the global batch (4 per device x 2 processes = 8)"
        in problems_of(raw, world_size=2)
    )
    raw["training"].update(generation_batch_size=None, num_generations=1)
    assert "training.num_generations: 1 is out of range; expected num_generations >= 2" in problems_of(
        raw, world_size=2
    )


def test_vllm_mode_is_checked() -> None:
    raw = load_template("grpo/tiny.yaml")
    raw["training"].update(use_vllm=True, vllm_mode="colocate")
    validate(raw)
    raw["training"]["vllm_mode"] = "remote"
    assert UNKNOWN_VLLM_MODE in problems_of(raw)


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"num_mini_batches": 3}, MINI_BATCHES_NOT_DIVIDING),
        ({"gradient_accumulation_steps": 2}, "use training.num_mini_batches"),
        ({"kl_estimator": "k2"}, "training.kl_estimator: expected one of 'k1', 'k3'; got 'k2'"),
    ],
)
def test_ppo_settings(change: Dict[str, Any], expected: str) -> None:
    raw = load_template("ppo/tiny.yaml")
    raw["training"].update(change)
    assert expected in problems_of(raw)
    raw = load_template("ppo/tiny.yaml")
    raw["model"]["lora"] = {"r": 8}
    assert PPO_WITH_LORA in problems_of(raw)


@pytest.mark.parametrize(
    "deepspeed, expected",
    [
        ({}, "distributed.deepspeed: give zero_stage (1, 2 or 3, with optional offload) or config"),
        ({"zero_stage": 3, "config": "ds.json"}, "distributed.deepspeed: give zero_stage"),
        ({"zero_stage": 4}, "distributed.deepspeed.zero_stage: input should be 1, 2 or 3"),
        ({"zero_stage": 2, "offload_params": True}, "offload_params: parameter offload needs zero_stage 3"),
        ({"config": "ds.json", "offload_optimizer": True}, "offload is set in your config file"),
        (
            {"zero_stage": 2, "stage": 2},
            "distributed.deepspeed.stage: unknown key; did you mean distributed.deepspeed.zero_stage?",
        ),
    ],
)
def test_deepspeed_settings(deepspeed: Dict[str, Any], expected: str) -> None:
    raw = load_template("sft/tiny.yaml")
    raw["distributed"] = {"deepspeed": deepspeed}
    assert expected in problems_of(raw)


@pytest.mark.parametrize(
    "distributed, expected",
    [
        (
            {"fsdp": {}, "deepspeed": {"zero_stage": 3}},
            "distributed: deepspeed and fsdp both shard the model; choose one",
        ),
        ({"fsdp": {"wrap_layers": []}}, "distributed.fsdp.wrap_layers: an empty list shards nothing"),
        (
            {"fsdp": {"offload": True}},
            "distributed.fsdp.offload: unknown key; did you mean distributed.fsdp.cpu_offload?",
        ),
        ({"fsdp": {"cpu_offload": "yes"}}, "distributed.fsdp.cpu_offload: input should be a valid boolean"),
        ({"fsdp": True}, "distributed.fsdp: input should be a valid dictionary"),
    ],
)
def test_fsdp_settings(distributed: Dict[str, Any], expected: str) -> None:
    raw = load_template("sft/tiny.yaml")
    raw["distributed"] = distributed
    assert expected in problems_of(raw)


def test_fsdp_defaults_shard_fully_without_offload() -> None:
    fsdp = validate(load_template("sft/tiny-fsdp.yaml")).distributed.fsdp
    assert fsdp is not None and fsdp.reshard_after_forward and not fsdp.cpu_offload and fsdp.wrap_layers is None


@pytest.mark.parametrize("sharding", [{"deepspeed": {"zero_stage": 2}}, {"fsdp": {}}], ids=["deepspeed", "fsdp"])
def test_ppo_runs_on_ddp_only(sharding: Dict[str, Any]) -> None:
    raw = load_template("ppo/tiny.yaml")
    raw["distributed"] = sharding
    assert f"distributed.{next(iter(sharding))}: posttrain's PPO runs on DDP" in problems_of(raw)


def test_a_tool_s_and_an_environment_s_timeout_is_checked_at_submit_time() -> None:
    raw = load_template("grpo/tiny-tools.yaml")
    raw["environment"] = {**raw["environment"], "timeout_s": 0}
    assert "environment.timeout_s: expected seconds above 0 (unset: 600); got 0" in problems_of(raw)
    raw.pop("environment")
    raw["tools"] = [{"function": "m:lookup", "timeout_s": -1}]
    assert "tools.0.timeout_s: expected seconds above 0 (unset: 600); got -1" in problems_of(raw)


def test_an_agent_program_plays_grpo_s_rollouts_scored_by_its_reward_and_its_evaluation() -> None:
    raw = load_template("grpo/tiny-agent.yaml")
    spec = validate(raw)
    assert spec.rewards == [] and spec.agent is not None and spec.agent.scorer_name() == "solve"
    # its evaluate: section plays the same program, where it names none of its own
    evaluate = {"data": {"eval": {"path": "templates/data/hidden_values_heldout.jsonl"}}}
    assert validate({**raw, "evaluate": evaluate}).evaluation_section().agent == spec.agent
    # one process waits for no other: its episodes may take as long as they take
    validate({**raw, "agent": {"function": "rooms:solve", "timeout_s": 3600}}, world_size=1)
    # its endpoint generates in vLLM, colocated or the job's role
    for mode in ("colocate", "server"):
        validate({**raw, "training": {**raw["training"], "use_vllm": True, "vllm_mode": mode}}, world_size=2)


@pytest.mark.parametrize(
    "change, problem",
    [
        (
            {"environment": {"factory": "posttrain.templates.tools.hidden_value:Room"}},
            "agent: an agent program makes its own calls through the endpoint; give tools and environment, or agent, "
            "not both",
        ),
        (
            {"training": {"max_tool_calling_iterations": 2}},
            "training.max_tool_calling_iterations: an agent program bounds its own rounds; drop it",
        ),
        (
            {"training": {"use_vllm": True, "vllm_mode": "colocate", "vllm_tensor_parallel_size": 2}},
            "training.vllm_tensor_parallel_size: 2 processes of a colocated vLLM generate together, and an agent "
            "program's endpoint generates on each process apart, as its episodes call; use 1, or vllm_mode: server",
        ),
        (
            {"training": {"use_vllm": True, "vllm_mode": "server"}, "generation": {"max_lag": 1}},
            "generation.max_lag: 1: tool calls, environments and agent programs run between the role's turns, in "
            "lockstep; use max_lag: 0 with tools, an environment or an agent",
        ),
        (
            {"training": {"remove_unused_columns": True}},
            "training.remove_unused_columns: true leaves each row its prompt alone, and the agent program reads the "
            "whole row; set it false",
        ),
        (
            {"rewards": [{"function": "my_scores:solve"}]},
            "agent.function: its reward's name in the logs, solve, is another reward's too; give the function "
            "another name",
        ),
        ({"agent": {"function": "rooms:solve", "timeout_s": -1}}, "agent.timeout_s: expected seconds above 0"),
        (
            {"distributed": {"deepspeed": {"zero_stage": 3}}},
            "distributed.deepspeed: an agent program's endpoint generates on each process apart, as its episodes call, "
            "and sharded weights make every process generate together; use DDP, or DeepSpeed ZeRO stage 1 or 2",
        ),
        (
            {"agent": {"function": "rooms:solve"}},
            "agent.timeout_s: a process's 16 episodes may take 630 s (agent.timeout_s each, 64 at once, plus 30 s), "
            "not below distributed.timeout_s (300 s), how long the other processes wait for them; give a shorter "
            "agent.timeout_s, or a longer distributed.timeout_s",
        ),
        ({"agent": None}, "rewards: give at least one reward (function, builtin or model)"),
    ],
)
def test_an_agent_program_in_grpo_is_checked_at_submit(change: Dict[str, Any], problem: str) -> None:
    raw = load_template("grpo/tiny-agent.yaml")
    raw = {**raw, **change, "training": {**raw["training"], **change.get("training", {})}}
    assert problem in problems_of(raw, world_size=2)


def test_a_generation_timeout_the_other_processes_would_not_wait_for_is_refused_with_several() -> None:
    raw = load_template("grpo/tiny-vllm-server.yaml")
    raw["generation"] = {"generate_timeout_s": 300}
    assert "generation.generate_timeout_s: 300 s is not below distributed.timeout_s (300 s)" in problems_of(
        raw, world_size=2
    )
    # one process waits for nothing else
    validate(raw, world_size=1)
    raw["generation"] = {"generate_timeout_s": 0}
    assert "generation.generate_timeout_s: expected seconds above 0" in problems_of(raw, world_size=1)


@pytest.mark.parametrize("template", ["rloo/tiny.yaml", "sft/tiny.yaml"])
def test_what_plays_episodes_in_an_algorithm_that_plays_none_names_grpo(template: str) -> None:
    raw = load_template(template)
    algorithm = raw["algorithm"]
    raw.update(agent={"function": "rooms:solve"}, tools=[{"function": "m:lookup"}])
    assert problems_of(raw).splitlines() == [
        f"{key}: posttrain.{algorithm} plays no episodes; tools, environments and agent programs train with "
        "posttrain.grpo (an evaluate: section judges with them too)"
        for key in ("tools", "agent")
    ]
