"""The job-side runtime: data checks, batch fitting, summary maths, sharding, the tiny model."""

import dataclasses
import doctest
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaForCausalLM, LlamaForSequenceClassification
from trl import SFTConfig

from golden_messages import VLLM_MODE_WITHOUT_VLLM
from helpers import TEMPLATES, build_trainer, load_template, sft_spec, tiny_job, trainer_with
from posttrain.components.spec.evaluation import validate_eval
from posttrain.components.spec.fields import config_fields
from posttrain.components.spec.loading import SpecError, validate
from posttrain.components.spec.registry import SPEC_CLASSES
from posttrain.entrypoints import deepspeed_launcher
from posttrain.entrypoints.inputs import tiny
from posttrain.entrypoints.inputs.data import check_online_data, fit_batch, load_data
from posttrain.entrypoints.inputs.models import EXTRA_MODEL_CLASSES, import_object, load_tokenizer
from posttrain.entrypoints.inputs.rewards import RewardCheck, resolve_rewards
from posttrain.entrypoints.job import checks, spec_parts
from posttrain.entrypoints.job.config import training_arguments
from posttrain.entrypoints.job.sharding import deepspeed_config, strategy_for
from posttrain.entrypoints.process import distributed
from posttrain.entrypoints.records import summary

SFT_FORMATS = SPEC_CLASSES["sft"].data_formats
SFT_CONFIG = SPEC_CLASSES["sft"].config_class


pytestmark = pytest.mark.usefixtures("hf_home")


def test_runtime_doctests() -> None:
    assert doctest.testmod(summary).failed == 0
    assert doctest.testmod(deepspeed_launcher).failed == 0


def test_tiny_model_is_deterministic_and_small() -> None:
    first, second = tiny.build_tokenizer(), tiny.build_tokenizer()
    assert first.get_vocab() == second.get_vocab() and len(first) == 512
    model_a, model_b = tiny.build_model(first, LlamaForCausalLM), tiny.build_model(second, LlamaForCausalLM)
    assert all((a == b).all() for a, b in zip(model_a.parameters(), model_b.parameters()))
    assert sum(p.numel() for p in model_a.parameters()) < 200_000
    scorer = tiny.build_model(first, LlamaForSequenceClassification)
    assert scorer.score.out_features == 1


def test_tiny_chat_template_marks_assistant_turns() -> None:
    tokenizer = tiny.build_tokenizer()
    messages = [{"role": "user", "content": "What is 1 plus 2?"}, {"role": "assistant", "content": "1 plus 2 is 3."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == "<|im_start|>user\nWhat is 1 plus 2?<|im_end|>\n<|im_start|>assistant\n1 plus 2 is 3.<|im_end|>\n"
    encoded = tokenizer.apply_chat_template(messages, return_assistant_tokens_mask=True, return_dict=True)
    assert 0 < sum(encoded["assistant_masks"]) < len(encoded["input_ids"])


def test_shipped_sft_data_loads_with_the_expected_columns() -> None:
    spec = validate(load_template("sft/tiny.yaml"))
    dataset = load_data(spec.data.train, {}, "data.train", SFT_FORMATS)
    assert len(dataset) >= 200 and dataset.column_names == ["messages"]


def test_wrong_columns_name_found_and_expected(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "q", "answer": "a"}\n')
    source = validate({**load_template("sft/tiny.yaml"), "data": {"train": {"path": str(path)}}}).data.train
    with pytest.raises(SpecError) as error:
        load_data(source, {}, "data.train", SFT_FORMATS)
    assert "found columns ['question', 'answer']; expected (messages) or (text) or (prompt, completion)" in str(
        error.value
    )
    renamed = load_data(source, {"question": "prompt", "answer": "completion"}, "data.train", SFT_FORMATS)
    assert renamed.column_names == ["prompt", "completion"]
    with pytest.raises(SpecError, match="data.columns: data.train has no column query"):
        load_data(source, {"query": "prompt"}, "data.train", SFT_FORMATS)
    with pytest.raises(SpecError, match="data.columns: question -> answer, but data.train has a column of that name"):
        load_data(source, {"question": "answer"}, "data.train", SFT_FORMATS)
    swapped = load_data(source, {"question": "completion", "answer": "prompt"}, "data.train", SFT_FORMATS)
    # renamed away, a name is free again
    assert swapped[0] == {"completion": "q", "prompt": "a"}


def test_missing_data_file_is_named(tmp_path: Path) -> None:
    source = validate({**load_template("sft/tiny.yaml"), "data": {"train": {"path": "nope.jsonl"}}}).data.train
    with pytest.raises(SpecError, match="data.train.path: no such file: nope.jsonl"):
        load_data(source, {}, "data.train", SFT_FORMATS)


def test_a_save_to_disk_directory_loads_as_a_data_set_or_a_split_of_a_dict(tmp_path: Path) -> None:
    import datasets

    rows = {"prompt": ["2+2?", "3+3?"], "completion": ["4", "6"]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(str(tmp_path / "dict"))
    for saved, split in (("one", "train"), ("dict", "train")):
        source = validate(
            {**load_template("sft/tiny.yaml"), "data": {"train": {"path": str(tmp_path / saved), "split": split}}}
        )
        assert load_data(source.data.train, {}, "data.train", SFT_FORMATS)[:] == rows
    source = validate(
        {**load_template("sft/tiny.yaml"), "data": {"train": {"path": str(tmp_path / "dict"), "split": "test"}}}
    )
    with pytest.raises(SpecError, match=r"data.train.split: .*dict has no split 'test'; it has train"):
        load_data(source.data.train, {}, "data.train", SFT_FORMATS)
    source = validate({**load_template("sft/tiny.yaml"), "data": {"train": {"path": str(tmp_path)}}})
    with pytest.raises(SpecError, match="is a directory, but not one datasets' save_to_disk wrote"):
        load_data(source.data.train, {}, "data.train", SFT_FORMATS)


@pytest.mark.parametrize("empty", ['""', '"  "', "[]"])
def test_empty_prompts_are_refused_naming_the_rows(tmp_path: Path, empty: str) -> None:
    path = tmp_path / "prompts.jsonl"
    rows = [
        f'{{"prompt": {empty if row in (2, 4) else chr(34) + "q" + chr(34) if empty != "[]" else "[{" + chr(34) + "role" + chr(34) + ": " + chr(34) + "user" + chr(34) + ", " + chr(34) + "content" + chr(34) + ": " + chr(34) + "q" + chr(34) + "}]"}}}'
        for row in range(1, 6)
    ]
    path.write_text("\n".join(rows) + "\n")
    source = validate({**load_template("grpo/tiny.yaml"), "data": {"train": {"path": str(path)}}}).data.train
    with pytest.raises(SpecError) as error:
        load_data(source, {}, "data.train", SPEC_CLASSES["grpo"].data_formats)
    assert str(error.value) == (
        "data.train: column prompt is empty in 2 of 5 rows (rows 2, 4); give every row a prompt, or drop those rows"
    )


def test_fit_batch_shrinks_to_the_data_or_fails() -> None:
    training = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4}
    assert fit_batch(training, SFT_CONFIG, 1000, 2) == training
    fitted = fit_batch(training, SFT_CONFIG, 20, 2)
    per, accum = fitted["per_device_train_batch_size"], fitted["gradient_accumulation_steps"]
    assert 2 * per * accum <= 20 and per >= 1
    # SFTConfig's default is 8
    assert fit_batch({}, SFT_CONFIG, 10, 2)["per_device_train_batch_size"] == 5
    with pytest.raises(SpecError, match="3 rows cannot give each of the 4 processes one example"):
        fit_batch(training, SFT_CONFIG, 3, 4)
    # KTO's KL term needs two examples per device: the batch never shrinks below the spec's least
    kto = SPEC_CLASSES["kto"].config_class
    assert fit_batch(training, kto, 5, 2, min_per_device=2)["per_device_train_batch_size"] == 2
    with pytest.raises(SpecError, match="3 rows cannot give each of the 2 processes 2 examples"):
        fit_batch(training, kto, 3, 2, min_per_device=2)


def test_training_arguments_on_cpu_are_owned_by_the_package(tmp_path: Path) -> None:
    spec = sft_spec(tmp_path)
    kwargs = training_arguments(spec, {k: v for k, v in spec.training.items() if k != "bf16"})
    assert kwargs["use_cpu"] is True and kwargs["bf16"] is False
    assert kwargs["ddp_timeout"] == spec.distributed.timeout_s
    assert kwargs["include_num_input_tokens_seen"] == "non_padding"
    SFTConfig(**kwargs)


def test_templates_point_at_shipped_data() -> None:
    """Each tiny template's data is a shipped file, or rows made in the job (reasoning-gym's, or a verifiers
    taskset's tasks, where the spec gives no data)."""
    for template in TEMPLATES.glob("*/tiny*.yaml"):
        raw = load_template(str(template.relative_to(TEMPLATES)))
        if "data" not in raw:
            assert "verifiers" in raw["environment"], template
            continue
        train = raw["data"]["train"]
        assert "reasoning_gym" in train or (TEMPLATES.parent / train["path"]).is_file(), template


def test_every_local_model_a_template_reads_is_another_templates_output() -> None:
    """A template that starts from a trained model names one a shipped template writes (run that first), or a
    stage of a shipped chain (``<output_dir>/<stage>``)."""
    templates = {path: load_template(str(path.relative_to(TEMPLATES))) for path in TEMPLATES.glob("*/*.yaml")}
    written = {raw["training"]["output_dir"] for raw in templates.values() if "training" in raw}
    written |= {
        f"{raw['output_dir']}/{stage}"
        for raw in templates.values()
        if raw["algorithm"] == "chain"
        for stage in raw["stages"]
    }
    for path, raw in templates.items():
        if raw["algorithm"] == "chain":
            # its stages hand their models on: components/spec/chain.py checks them
            continue
        spec = validate_eval(raw) if raw["algorithm"] == "eval" else validate(raw)
        for where, name in spec.named_models():
            if name.startswith(("outputs/", "./", "/")):
                assert name in written, f"{path.name}: {where} {name} is no template's training.output_dir"


def test_deepspeed_config_leaves_batch_and_precision_to_the_trainer(tmp_path: Path) -> None:
    spec = sft_spec(
        tmp_path, distributed={"deepspeed": {"zero_stage": 3, "offload_optimizer": True, "offload_params": True}}
    )
    config = deepspeed_config(spec.distributed.deepspeed)
    assert config["train_micro_batch_size_per_gpu"] == "auto" and config["bf16"] == {"enabled": "auto"}
    zero = config["zero_optimization"]
    assert (
        zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu" and zero["offload_param"]["device"] == "cpu"
    )
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    kwargs = training_arguments(spec, dict(spec.training))
    assert kwargs["deepspeed"] == config
    own = sft_spec(tmp_path, distributed={"deepspeed": {"config": str(tmp_path / "missing.json")}})
    with pytest.raises(SpecError, match="distributed.deepspeed.config: no such file"):
        deepspeed_config(own.distributed.deepspeed)


def test_fsdp_arguments_turn_on_fsdp2_through_the_hf_integration(tmp_path: Path) -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin

    fsdp = {"cpu_offload": True, "reshard_after_forward": False, "wrap_layers": ["LlamaDecoderLayer"]}
    spec = sft_spec(tmp_path, distributed={"fsdp": fsdp})
    training = {k: v for k, v in spec.training.items() if k != "activation_checkpointing"}
    args = SFTConfig(**training_arguments(spec, training))
    plugin_args = args.fsdp_plugin_args
    assert plugin_args["fsdp_version"] == 2 and plugin_args["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert plugin_args["transformer_cls_names_to_wrap"] == "LlamaDecoderLayer"
    assert plugin_args["cpu_offload"] is True and plugin_args["reshard_after_forward"] is False
    assert plugin_args["state_dict_type"] == "SHARDED_STATE_DICT"
    # TRL's default activation checkpointing moves to FSDP's layer wrapper, off the trainer
    assert plugin_args["activation_checkpointing"] is True and args.activation_checkpointing is False
    plugin = FullyShardedDataParallelPlugin(**plugin_args)
    assert plugin.fsdp_version == 2 and plugin.cpu_offload is not None


def test_a_trainer_that_set_up_another_strategy_is_refused(tmp_path: Path) -> None:
    from trl import SFTTrainer

    plain = sft_spec(tmp_path)
    args = SFTConfig(**training_arguments(plain, dict(plain.training)))
    tokenizer = load_tokenizer(plain.model.name_or_path, plain.model, "right")
    data = load_data(plain.data.train, {}, "data.train", SFT_FORMATS)
    trainer = SFTTrainer(
        model=tiny.build_model(tokenizer, LlamaForCausalLM), args=args, train_dataset=data, processing_class=tokenizer
    )
    assert strategy_for(plain.distributed).check_engine(trainer) == "single"
    for sharding in ({"fsdp": {}}, {"deepspeed": {"zero_stage": 3}}):
        asked = next(iter(sharding))
        with pytest.raises(SpecError, match=f"distributed.{asked}: asked for {asked}, but the trainer set up single"):
            strategy_for(sft_spec(tmp_path, distributed=sharding).distributed).check_engine(trainer)


def test_on_gpus_the_group_has_gloo_beside_nccl_for_posttrain_flags(tmp_path: Path, monkeypatch) -> None:
    # posttrain's own flags then create no NCCL communicator (one process never needs one) and sync no GPU
    made = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(distributed, "init_process_group", lambda backend, timeout: made.append(backend) or False)
    for sharding in ({}, {"fsdp": {}}, {"deepspeed": {"zero_stage": 2}}):
        strategy_for(sft_spec(tmp_path, distributed=sharding).distributed).init_process_group()
    # DeepSpeed's communication layer is told one backend, and its group has that one
    assert made == ["cuda:nccl,cpu:gloo", "cuda:nccl,cpu:gloo", "nccl"]
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    for backend, device in (("cuda:nccl,cpu:gloo", "cpu"), ("nccl", "cuda"), ("gloo", "cpu")):
        monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None, found=backend: found)
        assert distributed.collective_device() == device
    # run_summary.json's engine names the backend of the gradients' device, as the contract has it (docs/pages/outputs.md)
    named_by_device = (("cuda:nccl,cpu:gloo", "cuda", "nccl"), ("gloo", "cpu", "gloo"), ("nccl", "cuda", "nccl"))
    for backend, device, named in named_by_device:
        monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None, found=backend: found)
        assert distributed.backend_for(device) == named


def test_more_processes_on_a_node_than_its_gpus_stop_in_one_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(SpecError) as error:
        strategy_for(sft_spec(tmp_path).distributed).check_hardware()
    assert str(error.value) == (
        "-j: 2 processes on this node, which has 1 GPU(s) it can see; give each process a GPU (-j <nodes>x<GPUs per "
        "node>), or run on CPU (--gpu 0)"
    )
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    strategy_for(sft_spec(tmp_path).distributed).check_hardware()


def test_online_batches_are_checked_not_shrunk() -> None:
    from types import SimpleNamespace

    grpo = SimpleNamespace(generation_batch_size=16, num_generations=8, per_device_train_batch_size=8)
    check_online_data(SPEC_CLASSES["grpo"], grpo, 2, 2)
    with pytest.raises(
        SpecError, match=r"data.train: 1 prompts, fewer than one batch takes \(16 completions / 8 per prompt = 2\)"
    ):
        check_online_data(SPEC_CLASSES["grpo"], grpo, 1, 2)
    ppo = SimpleNamespace(per_device_train_batch_size=16)
    with pytest.raises(SpecError, match=r"\(16 per process x 2 processes = 32\)"):
        check_online_data(SPEC_CLASSES["ppo"], ppo, 20, 2)
    check_online_data(SPEC_CLASSES["sft"], ppo, 1, 2)


TRL_ALGORITHMS = sorted(name for name, cls in SPEC_CLASSES.items() if cls.config_class.startswith("trl"))
# the attribute a TRL trainer keeps each extra model in
EXTRA_MODEL_ATTRIBUTES = {"reference_model": "ref_model", "teacher_model": "teacher_model"}


@pytest.mark.parametrize("algorithm", TRL_ALGORITHMS)
def test_every_entrypoint_builds_its_trainer_with_its_models(tmp_path: Path, algorithm: str) -> None:
    from transformers.integrations import TensorBoardCallback

    job = tiny_job(
        tmp_path,
        algorithm,
        training={
            **load_template(f"{algorithm}/tiny.yaml")["training"],
            "output_dir": str(tmp_path / "out"),
            "report_to": "tensorboard",
        },
    )
    spec = job.spec
    trainer = build_trainer(job)
    assert type(trainer) is import_object(spec.trainer_name())
    if spec.model_class == "AutoModelForSequenceClassification":
        assert isinstance(trainer.model, LlamaForSequenceClassification) and trainer.model.config.num_labels == 1
    # loaded by the job, not by TRL
    for field in spec.extra_models:
        assert isinstance(getattr(trainer, EXTRA_MODEL_ATTRIBUTES[field]), torch.nn.Module), field
    if hasattr(spec, "rewards"):
        assert len(trainer.reward_funcs) == len(spec.rewards)
    if "reward_weights" in config_fields(spec.config_class):
        assert job.args.reward_weights == [reward.weight for reward in spec.rewards]
    assert any(isinstance(callback, TensorBoardCallback) for callback in trainer.callback_handler.callbacks)


def test_kto_batch_rules_are_the_trainers_own(tmp_path: Path) -> None:
    """The spec refuses what KTOTrainer refuses once the models are loaded, and no more."""
    loose = {"per_device_train_batch_size": 1, "train_sampling_strategy": "random"}
    job = tiny_job(
        tmp_path,
        "kto",
        training={
            **load_template("kto/tiny.yaml")["training"],
            **loose,
            "loss_type": "apo_zero_unpaired",
            "output_dir": str(tmp_path),
        },
    )
    assert job.spec.min_per_device_batch == 1 and validate(load_template("kto/tiny.yaml")).min_per_device_batch == 2
    # no KL term: TRL takes both
    build_trainer(job)
    with pytest.raises(SpecError) as refused:
        validate({**load_template("kto/tiny.yaml"), "training": {**job.spec.training, "loss_type": "kto"}})
    assert [p.split(":")[0] for p in refused.value.problems] == [f"training.{key}" for key in loose]
    # and TRL, given either one, refuses to build the trainer
    for key, value in loose.items():
        kwargs = training_arguments(job.spec, dict(job.spec.training))
        kwargs.update(loss_type="kto", per_device_train_batch_size=2, train_sampling_strategy="sequential")
        args = import_object(job.spec.config_class)(**{**kwargs, key: value})
        with pytest.raises(ValueError, match="batch size must be > 1|requires `train_sampling_strategy='sequential'`"):
            build_trainer(dataclasses.replace(job, args=args))


# what the spec refuses together (value_rules' requires rows; Spec._trainer_problems), with the message of TRL's
# trainer refusing it once the models are loaded
TRAINER_REFUSALS = [
    ("sft", {"eval_strategy": "steps"}, "you didn't pass an `eval_dataset`"),
    ("dpo", {"sync_ref_model": True, "lora": {"r": 8}}, "sync_ref_model=True` while using a PEFT model"),
    ("grpo", {"sync_ref_model": True, "beta": 0.0}, "sync_ref_model=True` while `beta=0.0`"),
    ("rloo", {"sync_ref_model": True, "beta": 0.0}, "sync_ref_model=True` while `beta=0.0`"),
    ("dpo", {"sync_ref_model": True, "precompute_ref_log_probs": True}, "cannot use `sync_ref_model=True` together"),
    ("kto", {"sync_ref_model": True, "precompute_ref_log_probs": True}, "cannot use `sync_ref_model=True` together"),
    ("dpo", {"loss_type": "exo_pair", "label_smoothing": 0.0}, "Label smoothing must be greater than 0.0"),
    ("dpo", {"loss_type": "apo_zero", "f_divergence_type": "js_divergence"}, "is only supported for the following"),
    ("dpo", {"loss_type": "aot", "use_weighting": True}, "WPO-style weighting is not implemented"),
    ("sft", {"padding_free": True, "max_length": 64}, "padding_free=True` without packing"),
    (
        "sft",
        {"activation_checkpointing_kwargs": {"selective": True}, "activation_checkpointing": False},
        "{'selective': True}` requires `gradient_checkpointing=True`",
    ),
    (
        "sft",
        {
            "activation_checkpointing_kwargs": {"selective": True, "use_reentrant": True},
            "activation_checkpointing": True,
        },
        "{'selective': True}` requires non-reentrant gradient checkpointing",
    ),
]


@pytest.mark.parametrize(
    "algorithm, together, trl_says", TRAINER_REFUSALS, ids=[f"{a}-{next(iter(t))}" for a, t, _ in TRAINER_REFUSALS]
)
def test_what_the_spec_refuses_together_the_trainer_refuses(
    tmp_path: Path, algorithm: str, together: dict, trl_says: str
) -> None:
    lora = together.pop("lora", None)
    with_lora = {"model": {"name_or_path": tiny.NAME, "lora": lora}, "reference_model": None} if lora else {}
    job = tiny_job(tmp_path, algorithm, **with_lora)
    with pytest.raises(SpecError, match="cannot go with|evaluates on data.eval|no reference model to sync"):
        validate({**job.spec.model_dump(), "training": {**job.spec.training, **together}})
    kwargs = {**training_arguments(job.spec, dict(job.spec.training)), **together}
    args = import_object(job.spec.config_class)(**kwargs)
    with pytest.raises((ValueError, NotImplementedError), match=re.escape(trl_says)):
        # once the models are loaded
        build_trainer(dataclasses.replace(job, args=args))


def test_orpos_null_max_length_is_refused_as_the_trainer_makes_it_512(tmp_path: Path) -> None:
    job = tiny_job(tmp_path, "orpo")
    with pytest.raises(SpecError, match=re.escape("training.max_length: null is not taken here; expected max_length")):
        validate({**job.spec.model_dump(), "training": {**job.spec.training, "max_length": None}})
    assert trainer_with(job, max_length=None).max_length == 512


@pytest.mark.parametrize("algorithm", ["grpo", "online_dpo"])
def test_vllms_options_without_use_vllm_do_nothing_in_the_trainer(tmp_path: Path, algorithm: str) -> None:
    """What the spec refuses as doing nothing: the trainer builds without vLLM, never reaching for the server named."""
    from transformers import GenerationConfig

    job = tiny_job(tmp_path, algorithm)
    unused = {"vllm_mode": "server", "vllm_server_base_url": "http://127.0.0.1:9", "vllm_gpu_memory_utilization": 0.9}
    with pytest.raises(SpecError, match=VLLM_MODE_WITHOUT_VLLM):
        validate({**job.spec.model_dump(), "training": {**job.spec.training, **unused}})
    trainer = trainer_with(job, **unused)
    assert not trainer.use_vllm and isinstance(trainer.generation_config, GenerationConfig)


def test_reward_models_load_through_the_jobs_loader_with_their_tokenizers(tmp_path: Path) -> None:
    rewards = [{"builtin": "contains", "args": {"target": "blue"}}, {"model": tiny.NAME, "weight": 0.5}]
    job = tiny_job(tmp_path, "grpo", rewards=rewards)
    funcs, tokenizers = job.load_rewards()
    assert callable(funcs[0]) and tokenizers[0] is None
    assert isinstance(funcs[1], LlamaForSequenceClassification) and funcs[1].config.num_labels == 1
    assert tokenizers[1].padding_side == "right" and funcs[1].config.pad_token_id == tokenizers[1].pad_token_id
    # TRL takes the loaded model and tokenizer as they are
    trainer = build_trainer(job)
    assert isinstance(trainer.reward_funcs[1], LlamaForSequenceClassification)
    assert trainer.reward_processing_classes[1].padding_side == "right"
    assert job.args.reward_weights == [1.0, 0.5]
    with pytest.raises(SpecError, match="rewards.1.model: no such directory: ./nowhere"):
        resolve_rewards(
            validate({**load_template("grpo/tiny.yaml"), "rewards": [rewards[0], {"model": "./nowhere"}]}).rewards
        )


def test_ppo_value_model_defaults_to_the_one_reward_model_else_the_policy(tmp_path: Path) -> None:
    assert EXTRA_MODEL_CLASSES["value_model"] == "AutoModelForSequenceClassification"

    def value_path(spec: Any) -> str:
        return spec.extra_model_paths()["value_model"]

    builtin = {"builtin": "contains", "args": {"target": "blue"}}
    ppo = {**load_template("ppo/tiny.yaml"), "rewards": [builtin]}
    policy = ppo["model"]["name_or_path"]
    assert value_path(validate(ppo)) == policy
    assert value_path(validate({**ppo, "rewards": [builtin, {"model": "./rm"}]})) == "./rm"
    assert value_path(validate({**ppo, "rewards": [{"model": "./rm"}, {"model": "./rm2"}]})) == policy
    assert value_path(validate({**ppo, "rewards": [{"model": "./rm"}], "value_model": "./vm"})) == "./vm"


def test_ppo_builds_its_trainer_from_the_jobs_models(tmp_path: Path) -> None:
    from posttrain.entrypoints import ppo

    trainer = ppo.build_trainer(tiny_job(tmp_path, "ppo"))
    assert not any(parameter.requires_grad for parameter in trainer.rollouts.ref_policy.parameters())
    assert isinstance(trainer.accelerator.unwrap_model(trainer.model).value_model, LlamaForSequenceClassification)
    assert len(trainer.rollouts.reward_functions) == 1 and callable(trainer.rollouts.reward_functions[0])


def test_progress_lines_come_from_rank_0_with_the_step_values_and_time_left(caplog: pytest.LogCaptureFixture) -> None:
    from transformers import TrainerControl, TrainerState

    from posttrain.entrypoints.job.callbacks import ProgressLog

    progress, state = ProgressLog(), TrainerState(max_steps=40, global_step=10, is_world_process_zero=True)
    progress.on_train_begin(None, state, TrainerControl())
    state.global_step = 12
    with caplog.at_level("INFO", logger="posttrain"):
        progress.on_log(None, state, TrainerControl(), logs={"loss": 1.23456, "learning_rate": 0.001, "epoch": 0.3})
        state.is_world_process_zero = False
        progress.on_log(None, state, TrainerControl(), logs={"loss": 1.0})
    assert len(caplog.records) == 1
    assert caplog.records[0].getMessage().startswith("step 12/40: loss 1.235, learning_rate 0.001 (")
    assert "s left)" in caplog.records[0].getMessage()


# What a trainer changes in its own config when it is built, each one TRL's documented doing (not ours):
# a field the spec sets that the trainer then ignores or overrides would show up here as a difference.
TRAINER_CHANGES = {
    # TRL derives them from the batch (documented)
    "grpo": {"generation_batch_size", "steps_per_generation"},
    "rloo": {"generation_batch_size", "steps_per_generation"},
    # its collator needs every column: TRL sets it false (refused in the spec)
    "orpo": {"remove_unused_columns"},
}


@pytest.mark.parametrize("algorithm", TRL_ALGORITHMS + ["ppo"])
def test_every_key_reaches_the_trainer_as_the_spec_says(tmp_path: Path, algorithm: str) -> None:
    """The live trainer's config equals the config built from the spec's training plus the package's fields."""
    import dataclasses

    job = tiny_job(tmp_path, algorithm)
    trainer = build_trainer(job)
    expected = import_object(job.spec.config_class)(**training_arguments(job.spec, dict(job.spec.training)))
    differing = {
        f.name
        for f in dataclasses.fields(expected)
        if f.init and getattr(trainer.args, f.name) != getattr(expected, f.name)
    }
    assert differing <= TRAINER_CHANGES.get(algorithm, set()), differing
    # and what the spec says is what the trainer has
    for key, value in job.spec.training.items():
        if key not in TRAINER_CHANGES.get(algorithm, set()):
            assert getattr(trainer.args, key) == getattr(expected, key), key


def test_ddp_searches_for_unused_parameters_only_in_models_that_can_leave_some() -> None:
    from transformers import LlamaConfig, MixtralConfig

    from posttrain.entrypoints.job.sharding import may_leave_parameters_unused

    small = {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 64,
    }
    assert not may_leave_parameters_unused(LlamaConfig(**small))
    assert may_leave_parameters_unused(MixtralConfig(**small, num_local_experts=4))
    # a config out of reach: DDP searches, as transformers would
    assert may_leave_parameters_unused(None)


def test_whether_ddp_searches_is_in_the_trainers_arguments_before_any_model_loads(tmp_path: Path) -> None:
    """Read from the model's config when the arguments are built: nothing changes them once the trainer has them."""
    from transformers import MixtralConfig

    MixtralConfig(hidden_size=16, num_hidden_layers=1, num_local_experts=4).save_pretrained(tmp_path / "moe")
    builtin = sft_spec(tmp_path)
    moe = sft_spec(tmp_path, model={**builtin.model.model_dump(), "name_or_path": str(tmp_path / "moe")})
    assert training_arguments(builtin, dict(builtin.training))["ddp_find_unused_parameters"] is False
    assert training_arguments(moe, dict(moe.training))["ddp_find_unused_parameters"] is True
    # the user's choice stands
    said = {**moe.training, "ddp_find_unused_parameters": False}
    assert training_arguments(moe, said)["ddp_find_unused_parameters"] is False


def test_an_evaluate_sections_inputs_are_checked_before_training(tmp_path: Path) -> None:
    """What the evaluation after training reads is checked with the run's own inputs, its keys under evaluate."""
    evaluate = load_template("sft/tiny-evaluated.yaml")["evaluate"]
    missing = {**evaluate, "data": {"eval": {"path": str(tmp_path / "gone.jsonl")}}}
    spec = sft_spec(tmp_path, evaluate=missing)
    with pytest.raises(SpecError) as error:
        checks.check_inputs(spec, spec_parts.parts(spec), 1, RewardCheck())
    assert error.value.problems[0].startswith(f"evaluate.data.eval.path: no such file: {tmp_path / 'gone.jsonl'}")
    # the model it evaluates is the run's to make: not a missing model yet
    spec = sft_spec(tmp_path, evaluate=evaluate)
    assert checks.check_inputs(spec, spec_parts.parts(spec), 1, RewardCheck()) is not None
