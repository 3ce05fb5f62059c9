"""Options a trainer reads only with another (or never) change nothing: two steps with all of them give the losses
two steps without them give, and where their switch is on they do count."""

from pathlib import Path
from typing import Any, Dict, List

import pytest

from helpers import refusal, tiny_job, trainer_with
from posttrain.components.spec.loading import validate

TIMINGS = ("runtime", "per_second", "time")


# what each trainer ignores with the tiny templates' settings (TRL's defaults)
IGNORED: Dict[str, Dict[str, Any]] = {
    "dpo": {
        "label_smoothing": 0.1,
        "discopop_tau": 0.5,
        "f_alpha_divergence_coef": 0.3,
        "ref_model_sync_steps": 1,
        "ref_model_mixup_alpha": 0.5,
        "precompute_ref_batch_size": 2,
        "label_smoothing_factor": 0.1,
    },
    "kto": {
        "ref_model_sync_steps": 1,
        "ref_model_mixup_alpha": 0.5,
        "precompute_ref_batch_size": 2,
        "label_smoothing_factor": 0.1,
    },
    "grpo": {
        "num_completions_to_print": 1,
        "log_unique_prompts": True,
        "log_multimodal": False,
        "entropy_target": 0.5,
        "entropy_coef_min": 0.1,
        "entropy_coef_max": 0.5,
        "entropy_coef_delta": 0.1,
        "use_bias_correction_kl": False,
        "ref_model_sync_steps": 1,
        "label_smoothing_factor": 0.1,
        "sapo_temperature_pos": 2.0,
        "vespo_k_pos": 1.0,
        "num_generations_eval": 2,
    },
    "rloo": {"ref_model_sync_steps": 1, "num_completions_to_print": 1, "label_smoothing_factor": 0.1},
    "orpo": {"max_completion_length": 4, "label_smoothing_factor": 0.1},
    "reward": {"label_smoothing_factor": 0.1},
    "distill": {"label_smoothing_factor": 0.1, "log_unique_prompts": True},
    "online_dpo": {"label_smoothing_factor": 0.1},
    "sft": {
        "packing_strategy": "wrapped",
        "do_train": True,
        "do_eval": True,
        "do_predict": True,
        "per_device_eval_batch_size": 2,
        "eval_accumulation_steps": 2,
        "eval_delay": 1,
        "eval_do_concat_batches": False,
        "eval_packing": False,
        "metric_for_best_model": "eval_loss",
        "greater_is_better": True,
    },
}


def logged(job: Any, **training: Any) -> List[Dict[str, float]]:
    """The figures two training steps log (timings left out)."""
    trainer = trainer_with(job, max_steps=2, logging_steps=1, save_strategy="no", **training)
    trainer.train()
    return [{k: v for k, v in entry.items() if not any(t in k for t in TIMINGS)} for entry in trainer.state.log_history]


@pytest.mark.parametrize("algorithm", sorted(IGNORED))
def test_options_the_trainer_ignores_are_refused_and_change_nothing(tmp_path: Path, algorithm: str) -> None:
    job = tiny_job(tmp_path, algorithm)
    for key, value in IGNORED[algorithm].items():
        message = refusal(job, **{key: value})
        assert f"training.{key}: " in message and "does nothing" in message
    assert logged(job, **IGNORED[algorithm]) == logged(job)


@pytest.mark.parametrize(
    "algorithm, counts, switch",
    [
        ("dpo", {"label_smoothing": 0.1}, {"loss_type": ["robust"]}),
        # SFT's nll loss (its default) smooths
        ("sft", {"label_smoothing_factor": 0.1}, {}),
        ("grpo", {"sapo_temperature_pos": 2.0, "sapo_temperature_neg": 2.0}, {"loss_type": "sapo"}),
    ],
)
def test_the_same_options_count_where_their_switch_is_on(
    tmp_path: Path, algorithm: str, counts: Dict[str, Any], switch: Dict[str, Any]
) -> None:
    """The comparison above sees a change where there is one."""
    job = tiny_job(tmp_path, algorithm)
    validate({**job.spec.model_dump(), "training": {**job.spec.training, **switch, **counts}})
    assert logged(job, **switch, **counts) != logged(job, **switch)
