"""The job fails fast and clearly: one ``posttrain: <problem>`` line per problem, from rank 0 alone, exit 2.

In process, one test per message (data, models, the TRL config, ranks
agreeing; rewards: ``test_reward_checks.py``); ranks in processes of their own are in
``tests/integration/test_job_errors.py``, the real ``torchx run`` launches in
``tests/e2e/test_job_errors.py``.
"""

import contextlib
import dataclasses
import http.server
import importlib.util
import json
import logging
import re
import threading
import time
from pathlib import Path
from typing import Iterator, List

import pytest

from helpers import REPO, build_trainer, load_template, stopped_in_process, tiny_job, trainer_with
from posttrain.components.spec.loading import validate
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.registry import SPEC_CLASSES
from posttrain.components.spec.sections import DataSource
from posttrain.entrypoints.inputs import data
from posttrain.entrypoints.inputs.data import load_data
from posttrain.entrypoints.inputs.models import (
    CAUSAL_LM,
    check_model_options,
    check_model_path,
    check_model_paths,
    import_object,
    is_local_path,
    load_model,
    load_tokenizer,
)
from posttrain.entrypoints.inputs.prepared import check_kept_rows
from posttrain.entrypoints.job import spec_parts
from posttrain.entrypoints.job.config import build_config, check_environment, training_arguments

LM = SPEC_CLASSES["sft"].data_formats
PREFERENCE = SPEC_CLASSES["dpo"].data_formats
KTO = SPEC_CLASSES["kto"].data_formats


pytestmark = pytest.mark.usefixtures("isolated")


def write(path: Path, rows: List[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def load_error(path: Path, formats=LM) -> str:
    with pytest.raises(SpecError) as error:
        load_data(DataSource(path=str(path)), {}, "data.train", formats)
    assert len(error.value.problems) == 1
    return str(error.value)


# ---------------------------------------------------------------- data


def test_a_corrupt_json_line_is_named_with_its_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "a"}\n\n{"text": "b",}\n{"text": "c"}\n')
    assert load_error(path) == (
        f"data.train.path: {path} line 3 is not valid JSON "
        "(Expecting property name enclosed in double quotes, column 14)"
    )
    # one JSON document, pretty-printed
    broken = tmp_path / "rows.json"
    broken.write_text('[\n  {"text": "a"}\n  {"text": "b"}\n]\n')
    message = f"data.train.path: {broken} line 3 is not valid JSON (Expecting ',' delimiter, column 3)"
    assert load_error(broken) == message


def test_a_hub_data_set_that_cannot_load_is_one_line(tmp_path: Path) -> None:
    where = "data.train.name: cannot load split"
    with pytest.raises(SpecError) as unreachable:
        load_data(DataSource(name="nobody/nothing"), {}, "data.train", SPEC_CLASSES["sft"].data_formats)
    assert (
        str(unreachable.value)
        == f"{where} 'train' of 'nobody/nothing': Couldn't reach 'nobody/nothing' on the Hub (OfflineModeIsEnabled)"
    )
    # load_dataset reads a directory as it reads a hub repo
    (tmp_path / "rows.jsonl").write_text('{"text": "a"}\n')
    with pytest.raises(SpecError) as no_split:
        load_data(DataSource(name=str(tmp_path), split="tset"), {}, "data.train", SPEC_CLASSES["sft"].data_formats)
    assert str(no_split.value).startswith(f"{where} 'tset' of '{tmp_path}': Unknown split \"tset\"")


def test_a_file_that_is_not_utf8_says_where(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    assert load_error(path) == (
        f"data.train.path: {path} is not UTF-8 text: byte 0xe9 at offset 28 (line 2); save it as UTF-8"
    )


def test_an_empty_file_says_so(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert load_error(empty) == f"data.train: {empty} is empty"
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n  \n")
    assert load_error(blank) == f"data.train: {blank} is empty (blank lines only)"


@pytest.mark.parametrize(
    "rows, formats, message",
    [
        (
            [{"prompt": 1, "completion": "a"}],
            LM,
            "column prompt holds numbers (int64); expected text or chat messages (a list of {role, content})",
        ),
        (
            [{"prompt": "p", "completion": "a"}, {"prompt": 3, "completion": "b"}],
            LM,
            "column prompt holds a number (3) in row 2; expected text or chat messages (a list of {role, content})",
        ),
        ([{"messages": "hello"}], LM, "column messages holds text; expected chat messages (a list of {role, content})"),
        ([{"text": ["a", "b"]}], LM, "column text holds lists of text; expected text"),
        (
            [{"prompt": "p", "completion": "a", "label": 1}],
            KTO,
            "column label holds numbers (int64); expected true/false",
        ),
        (
            [{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "p", "chosen": "c"}],
            PREFERENCE,
            "column rejected is missing or null in 1 of 2 rows (the first: row 2)",
        ),
    ],
)
def test_values_of_the_wrong_kind_are_named(tmp_path: Path, rows: List[dict], formats, message: str) -> None:
    assert load_error(write(tmp_path / "rows.jsonl", rows), formats) == f"data.train: {message}"


def test_chat_and_text_values_pass(tmp_path: Path) -> None:
    chat = [{"role": "user", "content": "hi"}]
    rows = [{"prompt": chat, "chosen": [{"role": "assistant", "content": "a"}], "rejected": "b"}]
    assert len(load_data(DataSource(path=str(write(tmp_path / "rows.jsonl", rows))), {}, "data.train", PREFERENCE)) == 1


def test_preference_pairs_that_are_no_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    same = [{"prompt": "p", "chosen": "a", "rejected": "a"}, {"prompt": "q", "chosen": "b", "rejected": "b"}]
    message = "data.train: chosen equals rejected in every row (2); a preference pair needs two different answers"
    assert load_error(write(tmp_path / "same.jsonl", same), PREFERENCE) == message
    warnings: List[str] = []
    monkeypatch.setattr(data.log, "warning", lambda text, *args: warnings.append(text % args))
    some = same[:1] + [{"prompt": "q", "chosen": "b", "rejected": "c"}] * 3
    load_data(DataSource(path=str(write(tmp_path / "some.jsonl", some))), {}, "data.train", PREFERENCE)
    assert warnings == [
        "data.train: chosen equals rejected in 1 of 4 rows (the first: row 1); those pairs teach nothing"
    ]


# ---------------------------------------------------------------- the TRL config


def test_the_trl_configs_own_checks_become_one_training_line(tmp_path: Path) -> None:
    raw = load_template("sft/tiny.yaml")
    raw["training"].update(
        output_dir=str(tmp_path / "out"), load_best_model_at_end=True, eval_strategy="steps", save_strategy="epoch"
    )
    # it would do nothing with save_strategy: epoch
    del raw["training"]["save_steps"]
    raw["data"]["eval"] = raw["data"]["train"]
    # the client cannot tell: only transformers' __post_init__ does
    spec = validate(raw)
    with pytest.raises(SpecError) as error:
        build_config(spec.config_class, training_arguments(spec, dict(spec.training)))
    assert str(error.value) == (
        "training: --load_best_model_at_end requires the save and eval strategy to match, except when "
        '--save_strategy="best", but found; Evaluation strategy: IntervalStrategy.STEPS; '
        "Save strategy: SaveStrategy.EPOCH"
    )


# what the job's environment lacks (the test says so first: it is about a package that is not installed)
MISSING_PACKAGES = [
    (
        {"optim": "schedule_free_adamw"},
        "schedulefree",
        "training.optim: schedule_free_adamw: You need to install `schedulefree` in order to use schedulefree "
        "optimizers",
    ),
    ({"report_to": "wandb"}, "wandb", "training.report_to: wandb: WandbCallback requires wandb to be installed"),
]


@pytest.mark.parametrize("training, package, message", MISSING_PACKAGES, ids=[p for _, p, _ in MISSING_PACKAGES])
def test_a_package_the_training_section_needs_is_named_before_any_model_loads(
    tmp_path: Path, training: dict, package: str, message: str
) -> None:
    assert importlib.util.find_spec(package) is None
    raw = load_template("sft/tiny.yaml")
    raw["training"].update(output_dir=str(tmp_path / "out"), **training)
    spec = validate(raw)
    with pytest.raises(SpecError, match=re.escape(message)):
        check_environment(build_config(spec.config_class, training_arguments(spec, dict(spec.training))))
    # installed: nothing to say
    raw["training"].update(optim="adamw_torch", report_to="tensorboard")
    check_environment(
        build_config(validate(raw).config_class, training_arguments(validate(raw), dict(raw["training"])))
    )


def test_push_to_hub_needs_the_hub_and_a_token_in_the_jobs_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    raw = load_template("sft/tiny.yaml")
    raw["training"].update(output_dir=str(tmp_path / "out"), push_to_hub=True)
    args = build_config(validate(raw).config_class, training_arguments(validate(raw), dict(raw["training"])))
    with pytest.raises(SpecError, match="training.push_to_hub: HF_HUB_OFFLINE is set"):
        # this file's fixture sets it
        check_environment(args)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    # HF_HOME is this test's own: no token saved there
    assert huggingface_hub.get_token() is None
    with pytest.raises(SpecError, match="training.push_to_hub: the job's environment has no Hugging Face token"):
        check_environment(args)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    with pytest.raises(
        SpecError,
        match=r"training.push_to_hub: the Hugging Face Hub \(https://huggingface.co\) "
        r"refused the job's token or cannot be reached from the job: ",
    ):
        # no network here: the trainer's constructor failed, after the models loaded
        check_environment(args)
    with hub_answering_whoami(accepted="hf_test") as endpoint:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
        check_environment(args)
        monkeypatch.setenv("HF_TOKEN", "hf_expired")
        with pytest.raises(SpecError, match=r"refused the job's token or cannot be reached from the job: .*401"):
            check_environment(args)
        # a Hub that never answers: the job waits a bounded time
        monkeypatch.setenv("HF_TOKEN", "hf_stalled")
        monkeypatch.setattr(huggingface_hub.constants, "DEFAULT_REQUEST_TIMEOUT", 0.5)
        with pytest.raises(SpecError, match=r"refused the job's token or cannot be reached from the job: .*timed out"):
            check_environment(args)


@contextlib.contextmanager
def hub_answering_whoami(accepted: str) -> Iterator[str]:
    """An HTTP server on localhost that answers the Hub's whoami: 200 for the ``accepted`` token, else 401 (for
    hf_stalled, after 3 s)."""

    class Whoami(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.headers.get("authorization") == "Bearer hf_stalled":
                time.sleep(3)
            ok = self.path == "/api/whoami-v2" and self.headers.get("authorization") == f"Bearer {accepted}"
            body = json.dumps({"name": "posttrain-test"} if ok else {"error": "Invalid credentials"}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Whoami)
    # closing does not wait for the stalled answer
    server.block_on_close = False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_fp16_on_cpu_is_refused_rather_than_trained_in_float32(tmp_path: Path) -> None:
    raw = load_template("sft/tiny.yaml")
    raw["training"].update(output_dir=str(tmp_path / "out"), fp16=True)
    # the client refuses it only where -h names a machine without GPUs
    spec = validate(raw)
    with pytest.raises(
        SpecError, match="training.fp16: float16 mixed precision runs on GPUs only; this job runs on CPU"
    ):
        training_arguments(spec, dict(spec.training))
    # what accelerate does with it on CPU: no autocast, float32
    job = tiny_job(tmp_path, "sft")
    args = import_object(spec.config_class)(**{**training_arguments(job.spec, dict(job.spec.training)), "fp16": True})
    accelerator = build_trainer(dataclasses.replace(job, args=args)).accelerator
    assert accelerator.mixed_precision == "fp16" and accelerator.native_amp is False


# ---------------------------------------------------------------- models


def test_a_lora_target_the_model_lacks_is_named_before_any_model_loads() -> None:
    raw = load_template("sft/tiny.yaml")
    raw["model"]["lora"] = {"r": 8, "target_modules": ["q_projj"]}
    missing = "model.lora: Target modules {'q_projj'} not found in the base model"
    with pytest.raises(SpecError, match=re.escape(missing)):
        check_model_options(
            spec_parts.parts(validate(raw)).models
            # PEFT's own matching, on a model built on the meta device
        )
    raw["model"]["lora"] = {"r": 8, "target_modules": ["q_proj", "v_proj"], "use_dora": True}
    check_model_options(spec_parts.parts(validate(raw)).models)


def test_quantization_without_bitsandbytes_is_named_before_any_model_loads() -> None:
    # the test extra leaves bitsandbytes out (tests/e2e/test_sft.py installs it aside for QLoRA's run)
    assert importlib.util.find_spec("bitsandbytes") is None
    raw = load_template("sft/tiny.yaml")
    raw["model"].update(quantization="4bit", lora={"r": 8})
    missing = "model.quantization: 4bit loads weights with bitsandbytes, which is not installed (pip install"
    with pytest.raises(SpecError, match=re.escape(missing)):
        check_model_options(spec_parts.parts(validate(raw)).models)


@pytest.mark.parametrize("algorithm", ["sft", "dpo"])
def test_a_router_loss_without_experts_is_named_before_any_model_loads(tmp_path: Path, algorithm: str) -> None:
    import transformers

    job = tiny_job(tmp_path, algorithm)
    raw = {**job.spec.model_dump(), "training": {**job.spec.training, "router_aux_loss_coef": 0.01}}
    with pytest.raises(SpecError, match="training.router_aux_loss_coef: 0.01 weighs the router loss of a mixture"):
        check_model_options(spec_parts.parts(validate(raw)).models)
    # TRL, once the model is loaded
    with pytest.raises(ValueError, match="is not a Mixture-of-Experts model"):
        trainer_with(job, router_aux_loss_coef=0.01)
    experts = tmp_path / "experts"
    transformers.MixtralConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=2,
    ).save_pretrained(experts)
    check_model_options(
        spec_parts.parts(validate({**raw, "model": {**raw["model"], "name_or_path": str(experts)}})).models
    )


def test_the_attention_implementation_is_checked_before_any_model_loads_and_honoured(tmp_path: Path) -> None:
    assert importlib.util.find_spec("flash_attn") is None
    raw = load_template("sft/tiny.yaml")
    raw["model"]["attn_implementation"] = "flash_attention_2"
    toggled = "model.attn_implementation: flash_attention_2: FlashAttention2 has been toggled on, but it cannot be used"
    with pytest.raises(SpecError, match=re.escape(toggled)):
        # a built-in
        check_model_options(spec_parts.parts(validate(raw)).models)
    spec = validate({**raw, "model": {"name_or_path": raw["model"]["name_or_path"]}})
    tokenizer = load_tokenizer(spec.model.name_or_path, spec.model, "right")
    load_model(spec.model.name_or_path, spec_parts.parts(spec).models, tokenizer, CAUSAL_LM).save_pretrained(
        tmp_path / "saved"
    )
    with pytest.raises(SpecError, match=re.escape(toggled)):
        check_model_options(
            spec_parts.parts(
                validate(
                    {
                        **raw,
                        "model": {"name_or_path": str(tmp_path / "saved"), "attn_implementation": "flash_attention_2"},
                    }
                )
            ).models
        )
    eager = validate({**raw, "model": {**raw["model"], "attn_implementation": "eager"}})
    check_model_options(spec_parts.parts(eager).models)
    assert (
        load_model(
            eager.model.name_or_path, spec_parts.parts(eager).models, tokenizer, CAUSAL_LM
        ).config._attn_implementation
        == "eager"
    )


def test_local_paths_and_hub_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    for name in ("outputs/sft", "./m", "../m", "/abs/m", "~/m", "models/nope", "a/b/c", "models"):
        assert is_local_path(name), name
    for name in ("org/name", "gpt2", "Qwen/Qwen2.5-0.5B-Instruct"):
        assert not is_local_path(name), name


def test_a_missing_chain_stage_says_an_earlier_run_writes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    with pytest.raises(SpecError) as error:
        check_model_path("outputs/nope-stage")
    assert str(error.value) == (
        f"model.name_or_path: no such directory: outputs/nope-stage (relative paths start at {REPO}); "
        "it is written by an earlier run (training.output_dir of that run); run that first"
    )
    if Path("outputs/sft-tiny").exists():
        pytest.skip("outputs/sft-tiny exists here")
    with pytest.raises(
        SpecError,
        match=r"outputs/sft-tiny \(relative paths start at .*\); it is written by an "
        r"earlier run: training.output_dir of templates/sft/tiny.yaml; run that first",
    ):
        check_model_path("outputs/sft-tiny")


def test_extra_models_are_checked_before_any_model_loads(tmp_path: Path) -> None:
    raw = {**load_template("dpo/tiny.yaml"), "reference_model": str(tmp_path / "ref")}
    with pytest.raises(SpecError, match=f"^reference_model: no such directory: {tmp_path / 'ref'} "):
        check_model_paths(spec_parts.parts(validate(raw)).models)


def test_a_directory_that_is_not_a_model_lists_what_it_lacks(tmp_path: Path) -> None:
    model = tmp_path / "model"
    (model / "checkpoint-20").mkdir(parents=True)
    (model / "checkpoint-20" / "trainer_state.json").write_text('{"global_step": 20}')
    (model / "config.json").write_text("{}")
    with pytest.raises(SpecError) as error:
        check_model_path(str(model))
    assert str(error.value) == (
        f"model.name_or_path: {model} is not a model directory: no weights (*.safetensors or *.bin), no tokenizer "
        "files (tokenizer.json, tokenizer.model, vocab.json, ...); it holds checkpoint-20 (an unfinished run?): "
        "name that directory"
    )
    import torch
    from safetensors.torch import save_file

    save_file({"weight": torch.zeros(16)}, str(model / "model.safetensors"))
    (model / "tokenizer.json").write_text("{}")
    check_model_path(str(model))
    whole = (model / "model.safetensors").read_bytes()
    # a copy cut short: every rank's traceback otherwise
    (model / "model.safetensors").write_bytes(whole[:-8])
    with pytest.raises(SpecError) as error:
        check_model_path(str(model))
    assert str(error.value) == (
        f"model.name_or_path: {model / 'model.safetensors'} is not whole: cut short at {len(whole) - 8} of "
        f"{len(whole)} bytes; copy the model again"
    )


def test_weights_of_another_shape_than_config_json_makes_are_named_before_any_model_loads(tmp_path: Path) -> None:
    import transformers

    from posttrain.entrypoints.inputs.models import check_weight_shapes

    model = tmp_path / "model"
    config = transformers.LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=64,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(model)
    # present: what is checked here is the weights
    (model / "tokenizer.json").write_text("{}")
    spec = validate({**load_template("sft/tiny.yaml"), "model": {"name_or_path": str(model)}})
    check_weight_shapes(spec_parts.parts(spec).models)
    # a config.json copied from another model
    config.intermediate_size = 48
    config.save_pretrained(model)
    with pytest.raises(SpecError) as error:
        check_weight_shapes(spec_parts.parts(spec).models)
    assert str(error.value) == (
        f"model.name_or_path: {model / 'model.safetensors'} holds model.layers.0.mlp.down_proj.weight of shape "
        f"[16, 32], where {model}/config.json makes it [16, 48]: the weights and config.json are of different models"
    )
    # packed: other shapes
    config.quantization_config = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    config.save_pretrained(model)
    check_weight_shapes(spec_parts.parts(spec).models)


# ---------------------------------------------------------------- ranks: printed once, everyone stops


def test_run_prints_on_rank_0_alone_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(REPO)
    raw = load_template("sft/tiny.yaml")
    raw["training"]["output_dir"] = str(tmp_path / "out")
    # the last check before a model loads
    raw["model"]["name_or_path"] = str(tmp_path / "no-model")
    spec_json = validate(raw).to_json()
    for rank, printed in (("0", 1), ("1", 0)):
        monkeypatch.setenv("RANK", rank)
        assert (
            stopped_in_process("sft", spec_json, capsys).count(
                f"posttrain: model.name_or_path: no such directory: {tmp_path}"
            )
            == printed
        )
    assert not (tmp_path / "out").exists()


def test_a_model_that_fails_to_load_on_one_rank_is_said_by_that_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # models load after the checks the ranks agree on: a download or a full disk on one node alone must not end
    # the job without a word (rank 0 may have loaded fine)
    import transformers

    from posttrain.entrypoints.inputs import tiny

    monkeypatch.chdir(REPO)
    tokenizer = tiny.build_tokenizer()
    tiny.build_model(tokenizer, transformers.LlamaForCausalLM).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    raw = load_template("sft/tiny.yaml")
    raw["training"]["output_dir"] = str(tmp_path / "out")
    raw["model"]["name_or_path"] = str(tmp_path / "model")

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", disk_full)
    monkeypatch.setenv("RANK", "1")
    err = stopped_in_process("sft", validate(raw).to_json(), capsys)
    assert err.count(f"posttrain: model: cannot load '{tmp_path / 'model'}': [Errno 28] No space left on device") == 1


# ---------------------------------------------------------------- through torchx (-m e2e)


def test_rows_the_trainer_drops_are_counted_and_none_left_stops_before_the_first_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    # TRL's reward trainer drops the pairs longer than max_length
    job = tiny_job(tmp_path, "reward")
    job = dataclasses.replace(job, eval_dataset=job.train_dataset.select(range(60)))
    with caplog.at_level(logging.WARNING, logger="posttrain"):
        check_kept_rows(trainer_with(job, max_length=24), job.train_dataset, job.eval_dataset)
    rows = len(job.train_dataset)
    for where, total in (("data.train", rows), ("data.eval", 60)):
        kept = re.search(
            rf"{where}: the trainer kept (\d+) of {total} rows, dropping those that do not fit "
            r"max_length \(24 tokens\)",
            caplog.text,
        )
        assert kept and 0 < int(kept[1]) < total, caplog.text
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("RANK", "0")
    raw = load_template("reward/tiny.yaml")
    raw["training"].update(output_dir=str(tmp_path / "out"), max_length=2)
    err = stopped_in_process("reward", validate(raw).to_json(), capsys)
    dropped = f"posttrain: data.train: the trainer dropped all {rows} rows, none fitting max_length (2 tokens)"
    assert err.count(dropped) == 1
    assert not list((tmp_path / "out").glob("checkpoint-*"))
