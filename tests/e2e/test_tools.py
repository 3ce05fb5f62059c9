"""Tools through the real ``torchx run``, GRPO teaching the tiny model to use them: templates/chain/tools-tiny.yaml,
where the answer is only known from the tool's result, and templates/chain/tool-use-tiny.yaml, where only the calls
earn the reward: one call for the lamp, two in order for the safe. (Generation in vLLM: tests/e2e/test_vllm.py.)"""

import json
import re
import subprocess
from pathlib import Path
from typing import Any, List

import pytest

from helpers import (
    CHAIN_PORTS,
    REPO,
    assert_calls_the_rooms_tool,
    assert_succeeded,
    ends,
    free_port,
    read_json,
    run_template,
    torchx,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tools_chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """templates/chain/tools-tiny.yaml run whole, on two processes: SFT, GRPO, and its gate."""
    tmp_path = tmp_path_factory.mktemp("tools-chain")
    output_dir = tmp_path / "tools"
    args = ["run", "-s", "local_cwd", "posttrain.chain", "--spec", "templates/chain/tools-tiny.yaml", "-j", "1x2"]
    args += ["--rdzv_port", str(free_port(CHAIN_PORTS)), f"output_dir={output_dir}"]
    assert_succeeded(torchx(args, tmp_path, timeout=900))
    return output_dir


def test_grpo_teaches_the_model_to_read_the_value_it_can_only_know_from_the_tool(
    tools_chain: Path, tmp_path: Path
) -> None:
    """Each room hides a digit drawn per row. The SFT model peeks in about a third of its answers and guesses the
    rest; GRPO raises the reward by 0.3 as it learns to peek and answer what it read. A run without the tool, from
    the same SFT model, stays at a guess's one in ten or below: the task needs the tool."""
    output_dir = tools_chain
    first, last = ends(output_dir / "grpo", "rewards/exact_match/mean")
    assert last - first >= 0.3, (first, last)
    assert_calls_the_rooms_tool(output_dir / "grpo")
    # the chain's gate: both models in rooms never trained in, as GRPO played them (templates/eval/tools-tiny.yaml)
    check = read_json(output_dir / "check" / "eval_summary.json")
    assert [verdict["held"] for verdict in check["require"]] == [True, True], check["require"]
    assert check["episodes"]["grpo"]["calls"] > check["episodes"]["sft"]["calls"] + 0.5, check["episodes"]
    assert_counted_by_hand(output_dir / "check")

    without_tool = tmp_path / "without-tool"
    # a guess stays a guess: 10 steps say so as well as 40
    overrides = [f"model.name_or_path={output_dir / 'sft'}", "~environment", "~training.max_tool_calling_iterations"]
    overrides += ["training.max_steps=10"]
    assert_succeeded(run_template("grpo/tiny-tools.yaml", tmp_path, without_tool, overrides=overrides))
    guessed = ends(without_tool, "rewards/exact_match/mean")[1]
    assert guessed < 0.35 and last - guessed >= 0.5, (guessed, last)


def test_grpo_teaches_the_model_to_switch_the_lamp_on_and_to_open_the_safe(tmp_path: Path) -> None:
    output_dir = tmp_path / "tool-use"
    args = ["run", "-s", "local_cwd", "posttrain.chain", "--spec", "templates/chain/tool-use-tiny.yaml", "-j", "1x2"]
    args += ["--rdzv_port", str(free_port(CHAIN_PORTS)), f"output_dir={output_dir}"]
    assert_succeeded(torchx(args, tmp_path, timeout=900))
    # each environment's own reward, the calls a rollout needs for it, and the result of the last of them
    tasks = (("lamp", "Lamp", 1, "The lamp is on."), ("safe", "Safe", 2, "The door is open."))
    for stage, environment, calls, done in tasks:
        first, last = ends(output_dir / stage, f"rewards/{environment}/mean")
        assert last - first >= 0.3, (stage, first, last)
        assert ends(output_dir / stage, "tools/call_frequency")[1] > 0.5 * calls
        for line in (output_dir / stage / "samples.jsonl").read_text().splitlines():
            sample = json.loads(line)
            results = [message["content"] for message in sample["completion"] if message["role"] == "tool"]
            assert sample["rewards"][environment] == float(done in results), sample
    # the gate: each GRPO model plays both tasks, and does its own more often than the SFT model, by its calls
    check = read_json(output_dir / "check" / "eval_summary.json")
    assert all(verdict["held"] for verdict in check["require"]), check["require"]
    for model, calls in (("lamp", 1), ("safe", 2)):
        assert check["models"][model][model]["mean"] - check["models"]["sft"][model]["mean"] >= 0.3
        episodes = [json.loads(line) for line in (output_dir / "check" / "eval_samples.jsonl").read_text().splitlines()]
        done = [e for e in episodes if e["model"] == model and e["scores"][model] == 1.0]
        assert done and all(e["episode"]["calls"] >= calls for e in done)


# written against docs/pages/eval.md (Agents), in a module the project never ships: a tool that answers 7 whatever
# the room, and a vault scored by its own get_reward; each named peek, with peek's docstring, as the model was
# trained to call (the tiny model calls only what it was trained on)
VAULT = """
def peek() -> str:
    \"\"\"The value hidden in this room.\"\"\"
    return "7"


class Vault:
    def reset(self, answer, **row):
        self.answer, self.opened = str(answer), 0

    def peek(self) -> str:
        \"\"\"The value hidden in this room.\"\"\"
        self.opened += 1
        return self.answer

    def get_reward(self) -> float:
        return 1.0 if self.opened == 1 else 0.0
"""


def tool_results(output_dir: Path) -> List[Any]:
    """Every tool result in the evaluation's transcripts, once their counts are checked by hand."""
    return [
        message["content"]
        for sample in assert_counted_by_hand(output_dir)
        for message in sample["episode"]["messages"]
        if message["role"] == "tool"
    ]


def assert_counted_by_hand(output_dir: Path) -> List[dict]:
    """The summary's episode counts are what a count of the transcripts in eval_samples.jsonl gives; the samples."""
    samples = [json.loads(line) for line in (output_dir / "eval_samples.jsonl").read_text().splitlines()]
    summary = read_json(output_dir / "eval_summary.json")
    for model, counted in summary["episodes"].items():
        played = [sample["episode"]["messages"] for sample in samples if sample["model"] == model]
        calls = [sum(len(m.get("tool_calls") or []) for m in messages) for messages in played]
        results = [sum(m["role"] == "tool" for m in messages) for messages in played]
        turns = [sum(m["role"] == "assistant" for m in messages) for messages in played]
        failed = sum("'error'" in str(m["content"]) for messages in played for m in messages if m["role"] == "tool")
        # every call answered: none of these episodes hit the rounds' or tokens' limit
        assert calls == results and counted["hit_limit"] == 0, model
        assert counted["episodes"] == len(played)
        assert counted["calls"] == pytest.approx(sum(calls) / len(played))
        assert counted["turns"] == pytest.approx(sum(turns) / len(played))
        assert counted["failed_calls"] == pytest.approx(failed / max(sum(calls), 1))
    return samples


def test_an_environment_and_a_tool_the_project_never_saw_evaluate_as_counted_by_hand_on_any_number_of_processes(
    tools_chain: Path, tmp_path: Path
) -> None:
    """The tools chain's trained model in a vault of the test's own: its get_reward is a scorer, its calls and turns
    are counted as its transcripts show, and one process gives the samples two do."""
    (tmp_path / "user_code").mkdir()
    (tmp_path / "user_code" / "vault.py").write_text(VAULT)
    models = [f"models.{stage}.name_or_path={tools_chain / stage}" for stage in ("sft", "grpo")]

    def evaluate(j: str, output_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
        args = ["run", "-s", "local_cwd", "posttrain.eval", "--spec", "templates/eval/tools-tiny.yaml", "-j", j]
        args += ["--rdzv_port", str(free_port()), *models, f"output_dir={output_dir}", *overrides]
        return torchx(args, tmp_path, PYTHONPATH=str(tmp_path / "user_code"))

    vault = ["environment={factory: 'vault:Vault'}", "require=[grpo.Vault - sft.Vault >= 0.3]"]
    for j in ("1x1", "1x2"):
        assert_succeeded(evaluate(j, tmp_path / j, *vault))
    one, two = (assert_counted_by_hand(tmp_path / j) for j in ("1x1", "1x2"))
    assert one == two
    # the vault's own reward: 1 where the episode peeked once, as its transcript shows
    for sample in one:
        peeks = sum(m["role"] == "tool" and m["name"] == "peek" for m in sample["episode"]["messages"])
        assert sample["scores"]["Vault"] == float(peeks == 1), sample

    # a tool alone: its calls counted as the transcripts show, each answered 7
    tool = ["~environment", "tools=[{function: 'vault:peek'}]", "require=[grpo.episodes.calls >= 0.5]"]
    assert_succeeded(evaluate("1x1", tmp_path / "tool", *tool))
    results = tool_results(tmp_path / "tool")
    assert results and set(results) == {"7"}
    # the tool's code edited: the same evaluation samples its episodes again, with the tool as it is now
    (tmp_path / "user_code" / "vault.py").write_text(VAULT.replace('return "7"', 'return "8"'))
    again = evaluate("1x1", tmp_path / "tool", *tool)
    assert_succeeded(again)
    assert "agent.tools changed since its results were written: sampling them again" in again.stdout + again.stderr
    again_results = tool_results(tmp_path / "tool")
    assert again_results and set(again_results) == {"8"}

    # the gate without the GRPO stage (the SFT model in its place): it fails, in one line naming the condition
    models[1] = f"models.grpo.name_or_path={tools_chain / 'sft'}"
    result = evaluate("1x1", tmp_path / "without", *vault)
    assert result.returncode == 1
    said = result.stdout + result.stderr
    assert re.search(
        r"posttrain: require: grpo.Vault - sft.Vault >= 0.3 does not hold: grpo.Vault [\d.]+, sft.Vault [\d.]+; difference 0$",
        said,
        re.M,
    ), said[-3000:]


def test_an_agent_program_plays_the_rooms_through_the_endpoint_as_the_episodes_loop_does(
    tools_chain: Path, tmp_path: Path
) -> None:
    """templates/eval/agent-rooms-tiny.yaml: the chain's models played by an agent written as a program, which calls
    each model through the job's OpenAI-compatible endpoint and runs the model's calls itself. Its reward shows what
    GRPO taught, and its gate holds; greedy, every transcript is the one posttrain's own episode loop plays with the
    room as an environment: the endpoint renders and reads back the conversation as training does."""
    models = [f"models.{stage}.name_or_path={tools_chain / stage}" for stage in ("sft", "grpo")]

    def evaluate(spec: str, output_dir: Path, *overrides: str) -> Path:
        args = ["run", "-s", "local_cwd", "posttrain.eval", "--spec", spec, "-j", "1x2"]
        args += ["--rdzv_port", str(free_port()), *models, f"output_dir={output_dir}", *overrides]
        assert_succeeded(torchx(args, tmp_path))
        return output_dir

    played = evaluate("templates/eval/agent-rooms-tiny.yaml", tmp_path / "program")
    summary = read_json(played / "eval_summary.json")
    assert [verdict["held"] for verdict in summary["require"]] == [True], summary["require"]
    assert all(summary["episodes"][model]["errors"] == 0 for model in ("sft", "grpo")), summary["episodes"]
    assert summary["episodes"]["grpo"]["calls"] > summary["episodes"]["sft"]["calls"] + 0.5, summary["episodes"]
    # the program's reward is its own verdict on the transcript the endpoint kept: 1 where the last reply is the value
    rows = (REPO / "templates/data/hidden_values_heldout.jsonl").read_text().splitlines()
    for sample in assert_counted_by_hand(played):
        said = sample["episode"]["messages"][-1]
        answer = json.loads(rows[sample["index"]])["answer"]
        assert sample["scores"]["solve"] == float(said["role"] == "assistant" and said["content"].strip() == answer)

    greedy = [
        "generation.temperature=0",
        "generation.num_samples=1",
        "require=[]",
        "~models.sft",
        "data.eval.max_rows=16",
    ]
    program = evaluate("templates/eval/agent-rooms-tiny.yaml", tmp_path / "greedy-program", *greedy)
    loop = evaluate(
        "templates/eval/tools-tiny.yaml", tmp_path / "greedy-loop", *greedy, "generation.engine=transformers"
    )
    transcripts = [
        [json.loads(line)["episode"]["messages"] for line in (where / "eval_samples.jsonl").read_text().splitlines()]
        for where in (program, loop)
    ]
    assert transcripts[0] == transcripts[1] and len(transcripts[0]) == 16


def test_grpo_teaches_an_agent_program_s_model_to_peek_from_the_tokens_the_endpoint_gave(
    tools_chain: Path, tmp_path: Path
) -> None:
    """The stages of templates/chain/agent-tiny.yaml after its SFT (the tools chain's): GRPO whose rollouts are the
    episodes of templates/agents/rooms.py, a program calling the policy through the job's endpoint, on two
    processes; the reward rises by 0.3 as the model learns to peek, and the gate of templates/eval/agent-rooms-tiny
    .yaml holds between the SFT model and this one."""
    output_dir = tmp_path / "grpo-agent"
    overrides = [f"model.name_or_path={tools_chain / 'sft'}"]
    assert_succeeded(run_template("grpo/tiny-agent.yaml", tmp_path, output_dir, j="1x2", overrides=overrides))
    first, last = ends(output_dir, "rewards/solve/mean")
    assert last - first >= 0.3, (first, last)
    logged = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(record.get("agent/errors", 0) == 0 for record in logged)
    assert ends(output_dir, "agent/peeked")[1] >= 0.8

    args = ["run", "-s", "local_cwd", "posttrain.eval", "--spec", "templates/eval/agent-rooms-tiny.yaml", "-j", "1x2"]
    args += ["--rdzv_port", str(free_port()), f"models.sft.name_or_path={tools_chain / 'sft'}"]
    args += [f"models.grpo.name_or_path={output_dir}", f"output_dir={tmp_path / 'check'}"]
    assert_succeeded(torchx(args, tmp_path))
    summary = read_json(tmp_path / "check" / "eval_summary.json")
    assert [verdict["held"] for verdict in summary["require"]] == [True], summary["require"]
