"""The spec of generation ahead of training (``generation:``), checked before anything starts: fast, without vLLM
(the runs are in tests/e2e/test_vllm.py, -m vllm)."""

from types import SimpleNamespace

import pytest

from helpers import load_template
from posttrain.components.spec.generation import TrainingGeneration
from posttrain.components.spec.loading import SpecError, validate
from posttrain.entrypoints.generation.run_ahead import RunAhead


def async_spec(template: str = "grpo/tiny-vllm-async.yaml", generation: dict = None, **training: object):
    raw = load_template(template)
    raw["training"].update(training)
    if generation is not None:
        raw["generation"] = generation
    return validate(raw)


def test_the_async_template_validates_and_lockstep_stays_the_default() -> None:
    assert async_spec().generation.max_lag == 1
    assert not validate(load_template("grpo/tiny-vllm-server.yaml")).generation.runs_ahead


@pytest.mark.parametrize(
    "change, message",
    [
        ({"generation": {"max_lag": -1}}, "generation.max_lag: expected 0 (lockstep) or more; got -1"),
        (
            {"generation": {"max_lag": 1, "weight_sync_steps": 3}},
            "generation.weight_sync_steps: 3 steps between pushes would leave samples older than max_lag: 1 allows; "
            "use at most 2, or raise max_lag",
        ),
        (
            {"generation": {"weight_sync_steps": 2}},
            "generation.weight_sync_steps: 2 with max_lag: 0 (lockstep), which pushes the weights before every "
            "generation; drop it, or let samples lag (max_lag: 1 or more)",
        ),
        (
            {"generation": {"max_lag": 1, "weight_sync_timeout_s": 0}},
            "generation.weight_sync_timeout_s: expected seconds above 0; got 0",
        ),
        (
            {"vllm_mode": "colocate"},
            "generation.max_lag: 1: the role that generates ahead is a vLLM server: set training.use_vllm: true and "
            "vllm_mode: server",
        ),
        (
            {"vllm_importance_sampling_correction": False},
            "training.vllm_importance_sampling_correction: false leaves samples of an older policy uncorrected; drop "
            "it with generation.max_lag: 1",
        ),
        (
            {"num_iterations": 2},
            "training.num_iterations: 2 passes over each batch; with generation.max_lag: 1 a batch is trained on once",
        ),
        (
            {"gradient_accumulation_steps": 3, "steps_per_generation": 2},
            "training.steps_per_generation: 2 micro-batches per generation would train one generation over two "
            "optimizer steps, older than generation.max_lag: 1 allows; use a divisor of gradient_accumulation_steps "
            "(3)",
        ),
        (
            {"generation_batch_size": 16},
            "training.generation_batch_size: with generation.max_lag: 1 a generation batch must stay within one "
            "optimizer step; set steps_per_generation instead (a divisor of gradient_accumulation_steps, 1)",
        ),
        (
            {"restore_callback_states_from_checkpoint": True},
            "training.restore_callback_states_from_checkpoint: with generation.max_lag: 1 the run-ahead's state comes "
            "back on resume by itself; drop it",
        ),
    ],
)
def test_what_keeps_the_role_from_running_ahead_is_one_line_each(change: dict, message: str) -> None:
    generation = change.pop("generation", None)
    with pytest.raises(SpecError) as error:
        async_spec(generation=generation, **change)
    assert str(error.value) == message


def test_rloo_tools_and_evaluation_during_training_stay_in_lockstep() -> None:
    rloo = load_template("rloo/tiny.yaml")
    rloo["training"].update(use_vllm=True, vllm_mode="server")
    rloo["generation"] = {"max_lag": 1}
    with pytest.raises(SpecError, match=r"^generation.max_lag: 1: rloo's trainer drops vLLM's log-probs"):
        validate(rloo)
    tools = load_template("grpo/tiny-tools.yaml")
    tools["training"].update(use_vllm=True, vllm_mode="server")
    tools["generation"] = {"max_lag": 1}
    with pytest.raises(
        SpecError, match=r"tool calls, environments and agent programs run between the role's turns, in lockstep"
    ):
        validate(tools)
    evaluated = load_template("grpo/tiny-vllm-async.yaml")
    evaluated["data"]["eval"] = evaluated["data"]["train"]
    evaluated["training"].update(eval_strategy="steps", eval_steps=10)
    with pytest.raises(SpecError, match=r"^data.eval: evaluation during training generates in lockstep"):
        validate(evaluated)


def reading_ahead(max_lag: int, max_steps: int, accumulation: int = 1) -> RunAhead:
    """A RunAhead on a stand-in trainer whose prompts are their own token ids, rank 0 of one process."""
    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(is_main_process=True),
        state=SimpleNamespace(global_step=0, max_steps=max_steps),
        args=SimpleNamespace(gradient_accumulation_steps=accumulation, steps_per_generation=accumulation),
        num_generations=2,
        _tokenize_prompts=lambda prompts: (prompts, None, {}),
        _get_num_items_in_batch=lambda batches, device: None,
    )
    return RunAhead(trainer, TrainingGeneration(max_lag=max_lag))


def test_the_loader_is_read_max_lag_steps_ahead_never_past_max_steps_and_each_epoch_from_its_step() -> None:
    run_ahead = reading_ahead(max_lag=2, max_steps=5)
    # a micro-batch: num_generations rows of one prompt (its token ids)
    epoch = iter([[{"prompt": [step]}] * 2 for step in range(4)])
    batches, _ = run_ahead.get_batch_samples(epoch, 1, None)
    assert batches == [[{"prompt": [0]}] * 2]
    assert [(batch.step, batch.prompts) for batch in run_ahead.taken] == [(0, [[0]]), (1, [[1]]), (2, [[2]])]
    run_ahead.trainer.state.global_step = 1
    run_ahead.get_batch_samples(epoch, 1, None)
    run_ahead.trainer.state.global_step = 2
    run_ahead.get_batch_samples(epoch, 1, None)
    # the epoch ran out at step 3: the next starts at the step training is at
    run_ahead.trainer.state.global_step = 4
    run_ahead.get_batch_samples(iter([[{"prompt": [9]}] * 2] * 3), 1, None)
    assert [batch.step for batch in run_ahead.taken] == [0, 1, 2, 3, 4]


def test_gradient_accumulation_asks_once_per_generation_batch_for_its_optimizer_step() -> None:
    run_ahead = reading_ahead(max_lag=1, max_steps=10, accumulation=2)
    epoch = iter([[{"prompt": [micro]}] * 2 for micro in range(8)])
    batches, _ = run_ahead.get_batch_samples(epoch, 2, None)
    assert len(batches) == 2 and len(run_ahead.ahead) == 2
    assert [(batch.step, batch.prompts) for batch in run_ahead.taken] == [(0, [[0]]), (1, [[2]])]
