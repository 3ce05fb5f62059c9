"""posttrain.chain before it runs: the chain's spec, its checks at submit, its request, and the job's bookkeeping."""

import doctest
import json
from pathlib import Path
from typing import Any, Dict, List

import pytest
from torchx.runner import get_runner
from torchx.schedulers.kubernetes_scheduler import sanitize_for_serialization

from helpers import TEMPLATES, assert_valid_png
from kubernetes_checks import check
from posttrain.components import algorithms
from posttrain.components.spec import chain as chain_spec
from posttrain.components.spec.chain import load_chain, validate_chain
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints import chain as chain_job

RLHF = str(TEMPLATES / "chain" / "rlhf-tiny.yaml")
SFT_DPO = str(TEMPLATES / "chain" / "sft-dpo-tiny.yaml")


def problems(raw: Dict[str, Any], overrides: List[str] = ()) -> List[str]:
    with pytest.raises(SpecError) as error:
        validate_chain(raw, overrides, base=TEMPLATES / "chain", world_size=2)
    return error.value.problems


def rlhf(**stages: Any) -> Dict[str, Any]:
    """The RLHF template's chain, with stages replaced."""
    import yaml

    raw = yaml.safe_load(Path(RLHF).read_text())
    raw["stages"].update(stages)
    return raw


@pytest.mark.parametrize("template", sorted((TEMPLATES / "chain").glob("*.yaml")), ids=lambda path: path.name)
def test_every_chain_template_validates_and_opens_with_its_command(template: Path) -> None:
    chain = load_chain(str(template), world_size=2)
    assert len(chain.stages) >= 2 and chain_spec.chain_from_json(chain.to_json()) == chain
    # the first line is the editor's schema modeline (tests/unit/generate/test_schema_json.py); the command comes next
    command = template.read_text().splitlines()[1]
    assert command.startswith("# torchx run -s ")
    assert f" posttrain.chain --spec templates/chain/{template.name}" in command


def test_the_templates_wire_each_stage_to_the_models_before_it() -> None:
    chain = load_chain(RLHF, world_size=2)
    assert [(stage.name, stage.spec.name()) for stage in chain.stages] == [
        ("sft", "sft"),
        ("check", "eval"),
        ("reward", "reward"),
        ("ppo", "ppo"),
    ]
    sft, check, reward, ppo = chain.stages
    assert [stage.output_dir for stage in chain.stages] == [
        "outputs/rlhf-tiny/sft",
        "outputs/rlhf-tiny/check",
        "outputs/rlhf-tiny/reward",
        "outputs/rlhf-tiny/ppo",
    ]
    assert reward.spec.model.name_or_path == ppo.spec.model.name_or_path == sft.output_dir
    assert ppo.spec.rewards[0].model == reward.output_dir
    # the gate: the SFT model against the base; its directory is the chain's, its results replaced when they change
    assert [(name, model.name_or_path) for name, model in check.spec.models.items()] == [
        ("base", "builtin:tiny-llama"),
        ("sft", sft.output_dir),
    ]
    assert check.spec.require == ["sft.regex_format - base.regex_format >= 0.3"] and check.spec.overwrite_output_dir
    # the rest of each stage is its template's
    assert ppo.spec.training["max_steps"] == 20
    dpo = load_chain(SFT_DPO, ["stages.dpo.training.beta=0.2", "output_dir=/tmp/elsewhere"], world_size=2).stages[1]
    assert dpo.spec.training["beta"] == 0.2 and dpo.spec.model.name_or_path == "/tmp/elsewhere/sft"
    assert dpo.output_dir == "/tmp/elsewhere/dpo"


def test_a_stage_problem_names_the_stage() -> None:
    found = problems(rlhf(), ["stages.ppo.training.learnig_rate=1e-3"])
    assert found == ["stages.ppo.training.learnig_rate: unknown key; did you mean stages.ppo.training.learning_rate?"]
    assert problems(rlhf(ppo={"spec": "../ppo/missing.yaml"})) == [
        f"stages.ppo.spec: no such file: {TEMPLATES / 'chain' / '../ppo/missing.yaml'}"
    ]


@pytest.mark.parametrize(
    "reference, message",
    [
        ("${stages.ppo.output}", "stage 'ppo' runs after 'reward'; a stage takes the output of an earlier one"),
        ("${stages.reward.output}", "no earlier stage 'reward' (earlier stages: sft, check)"),
        ("${stages.rm.output}", "no earlier stage 'rm' (earlier stages: sft, check)"),
        ("${stages.sft.model}", "a chain refers to an earlier stage's model as ${stages.<name>.output}"),
    ],
)
def test_a_stage_takes_only_an_earlier_stage_s_output(reference: str, message: str) -> None:
    found = problems(rlhf(reward={"spec": "../reward/tiny.yaml", "model": {"name_or_path": reference}}))
    assert found == [f"stages.reward.model.name_or_path: {reference}: {message}"]


def test_a_model_goes_only_where_its_kind_is_taken() -> None:
    as_policy = rlhf(ppo={"spec": "../ppo/rlhf-tiny.yaml", "model": {"name_or_path": "${stages.reward.output}"}})
    assert problems(as_policy)[0].startswith(
        "stages.ppo.model.name_or_path: stage 'reward' (reward) writes a reward model (one score per sequence), and "
        "model.name_or_path takes a causal LM (a policy)"
    )
    as_reward = rlhf(ppo={"spec": "../ppo/rlhf-tiny.yaml", "rewards": [{"model": "${stages.sft.output}"}]})
    assert problems(as_reward) == [
        "stages.ppo.rewards.0.model: stage 'sft' (sft) writes a causal LM, and rewards.0.model takes a reward "
        "model: a reward stage's output"
    ]


def test_a_stage_that_needs_a_vllm_server_role_is_refused() -> None:
    grpo = {"spec": "../grpo/tiny-vllm-server.yaml", "model": {"name_or_path": "${stages.sft.output}"}}
    assert problems(
        {"algorithm": "chain", "output_dir": "out", "stages": {"sft": {"spec": "../sft/tiny.yaml"}, "grpo": grpo}}
    ) == [
        "stages.grpo.training.vllm_mode: server needs a vllm role beside the trainers, which a chain does not run; "
        "use vllm_mode: colocate, or a server of your own (vllm_server_base_url)"
    ]


@pytest.mark.parametrize(
    "raw, overrides, message",
    [
        ({"algorithm": "chain", "stages": {}}, [], "output_dir: required"),
        ({"algorithm": "chain", "output_dir": "out", "stages": {}}, [], "stages: required"),
        ({"algorithm": "sft", "output_dir": "out", "stages": {"a": {}}}, [], "algorithm: expected chain"),
        ({"algorithm": "chain", "output_dir": "out", "stages": {"SFT": {}}}, [], "stages.SFT: a stage's name is"),
        (rlhf(), ["training.max_steps=3"], "a chain's overrides are stages.<name>.<key.path>=value"),
        (rlhf(), ["stages.dpo.training.max_steps=3"], "no stage 'dpo' in this chain; it has sft, check, reward, ppo"),
    ],
)
def test_a_malformed_chain_is_refused_in_one_line(raw: Dict[str, Any], overrides: List[str], message: str) -> None:
    assert message in problems(raw, overrides)[0]


def test_a_chain_makes_a_valid_volcano_job() -> None:
    app = algorithms.chain(spec=RLHF, image="registry.example/posttrain:1", j="2x2", gpu=2, rdzv_port=29511)
    with get_runner() as runner:
        job = sanitize_for_serialization(runner.dryrun(app, "kubernetes", cfg={"queue": "default"}).request.resource)
    check(job)
    command = job["spec"]["tasks"][1]["template"]["spec"]["containers"][0]["command"][2]
    assert command.startswith("exec python -m posttrain.entrypoints.chain --spec-json")
    assert "--node '1' --rank0-host ${VC_CHAIN_0_HOSTS:=localhost} --" in command
    assert "--rdzv_endpoint ${VC_CHAIN_0_HOSTS:=localhost}:29511" in command


def test_each_stage_gets_its_own_rendezvous() -> None:
    chain = load_chain(SFT_DPO, world_size=4)
    launcher = ["--rdzv_backend", "c10d", "--rdzv_endpoint", "$HOST:29511", "--rdzv_id", "job-1", "--nnodes", "2"]
    command = chain_job.stage_command(chain.stages[1], 1, launcher)
    assert command[1:3] == ["-m", "posttrain.entrypoints.launcher"]
    assert command[3:9] == ["--rdzv_backend", "c10d", "--rdzv_endpoint", "$HOST:29512", "--rdzv_id", "job-1-dpo"]
    assert command[-4:-1] == ["-m", "posttrain.entrypoints.dpo", "--spec-json"]
    assert json.loads(command[-1])["training"]["output_dir"] == "outputs/sft-dpo-tiny/dpo"
    one_node = ["--rdzv_endpoint", "localhost:0", "--rdzv_id", "job-1"]
    assert chain_job.stage_command(chain.stages[1], 1, one_node)[3:7] == [
        "--rdzv_endpoint",
        "localhost:0",
        "--rdzv_id",
        "job-1-dpo",
    ]


def test_a_finished_stage_whose_spec_changed_stops_the_chain(tmp_path: Path) -> None:
    chain = load_chain(SFT_DPO, [f"output_dir={tmp_path}"], world_size=2)
    sft = chain.stages[0]
    state = {"stages": {"sft": {"spec": sft.spec.model_dump(mode="json"), "seconds": 12.0}}}
    (tmp_path / chain_job.STATE_FILE).write_text(json.dumps(state))
    # recorded, but its directory holds no finished run
    assert list(chain_job.finished_stages(chain)) == []
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "run_summary.json").write_text("{}")
    assert list(chain_job.finished_stages(chain)) == ["sft"]
    changed = load_chain(SFT_DPO, [f"output_dir={tmp_path}", "stages.sft.training.max_steps=20"], world_size=2)
    with pytest.raises(SpecError) as error:
        chain_job.finished_stages(changed)
    assert str(error.value) == (
        f"stages.sft: finished in {tmp_path}/sft under another spec (training.max_steps changed since); delete "
        f"{tmp_path}/sft to train it (and the stages after it) again, or give the chain another output_dir"
    )


def test_a_finished_stage_with_an_evaluate_section_runs_again_and_the_stages_after_it_do_not(tmp_path: Path) -> None:
    evaluate = [
        "stages.sft.evaluate={data: {eval: {path: templates/data/questions_heldout.jsonl}}, "
        "rewards: [{builtin: contains, args: {column: answer}}]}"
    ]
    chain = load_chain(SFT_DPO, [f"output_dir={tmp_path}", *evaluate], world_size=2)
    state = {"stages": {stage.name: {"spec": stage.spec.model_dump(mode="json")} for stage in chain.stages}}
    (tmp_path / chain_job.STATE_FILE).write_text(json.dumps(state))
    for stage in chain.stages:
        Path(stage.output_dir).mkdir()
        (Path(stage.output_dir) / "run_summary.json").write_text("{}")
    # its job trains nothing and evaluates
    assert list(chain_job.finished_stages(chain)) == ["dpo"]
    # nor is another evaluation a change of what it trained
    other = load_chain(
        SFT_DPO, [f"output_dir={tmp_path}", *evaluate, "stages.sft.evaluate.generation.seed=3"], world_size=2
    )
    assert list(chain_job.finished_stages(other)) == ["dpo"]


def test_doctests() -> None:
    assert doctest.testmod(chain_job).failed == 0 and doctest.testmod(chain_spec).failed == 0


def fake_stages(monkeypatch: pytest.MonkeyPatch, failing: str = "") -> List[str]:
    """Stages that write what a finished run writes, without training; ``failing`` exits 2 instead. Returns the
    stages run, in order, with the stage name each was told."""
    ran = []

    def run(self: chain_job.Stopping, command: List[str], env: Dict[str, str]) -> int:
        spec = json.loads(command[-1])
        ran.append(env[chain_spec.STAGE_ENV])
        if spec["algorithm"] == failing:
            return 2
        output_dir = Path(spec["training"]["output_dir"])
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0}\n')
        first, last = {"loss": 2.0}, {"loss": 1.0}
        (output_dir / "run_summary.json").write_text(
            json.dumps({"global_steps": 2, "metrics_first": first, "metrics_last": last})
        )
        return 0

    monkeypatch.setattr(chain_job.Stopping, "run", run)
    return ran


def run_chain(tmp_path: Path, node: str = "0", *overrides: str) -> int:
    chain = load_chain(SFT_DPO, [f"output_dir={tmp_path}", *overrides], world_size=2)
    launcher = ["--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", "--rdzv_id", "job-1", "--nnodes", "1"]
    return chain_job.main(
        ["--spec-json", chain.to_json(), "--node", node, "--rank0-host", "localhost", "--", *launcher]
    )


def test_the_chain_runs_its_stages_in_order_and_a_rerun_skips_the_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    ran = fake_stages(monkeypatch)
    assert run_chain(tmp_path) == 0
    assert ran == ["sft", "dpo"]
    state = json.loads((tmp_path / chain_job.STATE_FILE).read_text())["stages"]
    assert set(state) == {"sft", "dpo"} and state["dpo"]["spec"]["model"]["name_or_path"] == f"{tmp_path}/sft"
    summary = json.loads((tmp_path / "run_summary.json").read_text())
    assert [(s["name"], s["status"], s["metrics_last"]) for s in summary["stages"]] == [
        ("sft", "finished", {"loss": 1.0}),
        ("dpo", "finished", {"loss": 1.0}),
    ]
    assert set(assert_valid_png(tmp_path / "curves.png")["runs"]) == {"sft", "dpo"}
    err = capsys.readouterr().err
    assert err.count("posttrain: ") == 1 and f"sft -> {tmp_path}/sft, dpo -> {tmp_path}/dpo" in err

    ran.clear()
    # all finished
    assert run_chain(tmp_path) == 0 and ran == []
    # SFT trained again: and so DPO, on the new SFT model
    (tmp_path / "sft" / "run_summary.json").unlink()
    assert run_chain(tmp_path) == 0 and ran == ["sft", "dpo"]


def test_a_failed_stage_ends_the_chain_with_its_code_and_the_summary_says_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    ran = fake_stages(monkeypatch, failing="dpo")
    assert run_chain(tmp_path) == 2 and ran == ["sft", "dpo"]
    # the stage's launcher said why
    assert "posttrain: " not in capsys.readouterr().err
    summary = json.loads((tmp_path / "run_summary.json").read_text())
    assert [(s["name"], s["status"]) for s in summary["stages"]] == [("sft", "finished"), ("dpo", "failed")]
    ran.clear()
    assert run_chain(tmp_path) == 2 and ran == ["dpo"]


def test_only_node_0_writes_and_speaks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    fake_stages(monkeypatch)
    assert run_chain(tmp_path, "1") == 0
    assert not (tmp_path / chain_job.STATE_FILE).exists() and not (tmp_path / "run_summary.json").exists()
    assert capsys.readouterr().err == ""


def test_a_changed_finished_stage_stops_every_node_and_node_0_says_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    ran = fake_stages(monkeypatch)
    assert run_chain(tmp_path) == 0
    ran.clear()
    capsys.readouterr()
    assert run_chain(tmp_path, "1", "stages.sft.training.max_steps=7") == 2
    assert capsys.readouterr().err == ""
    assert run_chain(tmp_path, "0", "stages.sft.training.max_steps=7") == 2 and ran == []
    err = capsys.readouterr().err
    assert err.count("posttrain: ") == 1 and "posttrain: stages.sft: finished in" in err


def test_an_evaluation_stage_s_directory_is_the_chain_s_and_its_models_generate() -> None:
    assert problems(rlhf(), ["stages.check.output_dir=/tmp/mine"]) == [
        "stages.check.output_dir: the chain sets it (outputs/rlhf-tiny/check); set the chain's output_dir"
    ]
    # the reward stage's model scores sequences: an evaluation samples from each of its models
    gate = {"spec": "../eval/sft-tiny.yaml", "models": {"sft": {"name_or_path": "${stages.reward.output}"}}}
    raw = rlhf(late=gate)
    assert problems(raw) == [
        "stages.late.models.sft.name_or_path: stage 'reward' (reward) writes a reward model (one score per "
        "sequence), and models.sft.name_or_path takes a causal LM (a policy)"
    ]
    # an evaluation writes no model to train from, and its directory's results are the chain's to replace
    after = {"spec": "../dpo/tiny.yaml", "model": {"name_or_path": "${stages.check.output}"}}
    assert problems(rlhf(dpo=after)) == [
        "stages.dpo.model.name_or_path: stage 'check' is an evaluation; it writes scores, no model"
    ]
    assert problems(rlhf(), ["stages.check.overwrite_output_dir=false"])[0].startswith(
        "stages.check.overwrite_output_dir: the chain sets it (true)"
    )
