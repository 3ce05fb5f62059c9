"""GRPO's and RLOO's step split into micro-batches trains as the whole step (fast_paths.micro_batches): through
TRL's own trainers on CPU, the same generation batch as 1 micro-batch of 8 rows and as 4 of 2, accumulated, gives
the same weights after two steps for every loss type the split is made for, and different ones for bnpo's."""

from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
from datasets import Dataset
from transformers import LlamaForCausalLM

from posttrain.entrypoints.inputs import tiny
from posttrain.entrypoints.inputs.data import longest_prompt


def reward_length(completions: List[str], **kwargs: Any) -> List[float]:
    return [float(len(completion)) for completion in completions]


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny tool-calling model (Qwen2.5's chat template), saved: without attention dropout (it would draw per micro-batch), and with its EOS row of the
    output layer scaled up, so that completions end at different lengths (bnpo's token mean then differs from a
    mean over rows)."""
    path = tmp_path_factory.mktemp("policy")
    tokenizer = tiny.build_tokenizer_tools()
    model = tiny.build_model_tools(tokenizer, LlamaForCausalLM)
    model.config.attention_dropout = 0.0
    with torch.no_grad():
        model.get_output_embeddings().weight[tokenizer.eos_token_id] *= 30
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def trained(
    policy: str, tmp_path: Path, algorithm: str, rows: int, accumulated: int, **training: Any
) -> Dict[str, torch.Tensor]:
    """The model's weights after two steps of 8 completions (2 prompts x 4), SGD without clipping: a change of the
    loss's scale would show in the weights (Adam's first step would hide it)."""
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    config_class, trainer_class = {"grpo": (GRPOConfig, GRPOTrainer), "rloo": (RLOOConfig, RLOOTrainer)}[algorithm]
    args = config_class(
        output_dir=str(tmp_path / f"{algorithm}-{rows}x{accumulated}"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=rows,
        gradient_accumulation_steps=accumulated,
        num_generations=4,
        max_completion_length=8,
        **{"max_steps": 2, "optim": "sgd", "learning_rate": 0.1, "max_grad_norm": 0.0, **training},
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    prompts = Dataset.from_dict({"prompt": [f"count to {n}:" for n in range(16)]})
    trainer = trainer_class(model=policy, reward_funcs=reward_length, args=args, train_dataset=prompts)
    trainer.train()
    return {name: parameter.detach().clone() for name, parameter in trainer.model.named_parameters()}


def largest_difference(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> float:
    return max((a[name] - b[name]).abs().max().item() for name in a)


@pytest.mark.parametrize(
    "algorithm, training",
    [
        ("grpo", {"loss_type": "dapo"}),
        ("grpo", {"loss_type": "grpo", "beta": 0.1}),
        ("grpo", {"loss_type": "dr_grpo"}),
        ("rloo", {}),
    ],
    ids=["grpo-dapo", "grpo-grpo-kl", "grpo-dr_grpo", "rloo"],
)
def test_a_step_in_micro_batches_trains_as_the_whole_step(
    policy: str, tmp_path: Path, algorithm: str, training: Dict
) -> None:
    whole = trained(policy, tmp_path, algorithm, 8, 1, **training)
    split = trained(policy, tmp_path, algorithm, 2, 4, **training)
    start = trained(policy, tmp_path, algorithm, 8, 1, **{**training, "learning_rate": 0.0})
    # it trained, and the split changed nothing of it
    assert largest_difference(whole, start) > 1e-3
    assert largest_difference(whole, split) < 1e-5


def test_bnpo_s_token_mean_per_micro_batch_changes_with_the_split(policy: str, tmp_path: Path) -> None:
    whole = trained(policy, tmp_path, "grpo", 8, 1, loss_type="bnpo")
    split = trained(policy, tmp_path, "grpo", 2, 4, loss_type="bnpo")
    assert largest_difference(whole, split) > 1e-4


def add(a: int, b: int) -> int:
    """Adds two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


@pytest.mark.parametrize("kind", ["chat", "chat-tools", "text"])
def test_the_longest_prompt_is_counted_as_the_trainer_tokenizes_it(policy: str, tmp_path: Path, kind: str) -> None:
    """The estimate's row length (fast_paths.micro_batches) starts from the longest prompt: the one TRL's own
    ``_tokenize_prompts`` makes longest, template, generation prompt, tools' schemas and special tokens counted."""
    from trl import GRPOConfig, GRPOTrainer

    texts = ["hi", "count from one to twenty, slowly, and say each number twice", "count to 3"]
    prompts = texts if kind == "text" else [[{"role": "user", "content": text}] for text in texts]
    tools = [add] if kind == "chat-tools" else []
    args = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=3, num_generations=3
    )
    dataset = Dataset.from_dict({"prompt": prompts})
    trainer = GRPOTrainer(
        model=policy, reward_funcs=reward_length, args=args, train_dataset=dataset, tools=tools or None
    )
    tokenized = trainer._tokenize_prompts(prompts)[0]
    longest = longest_prompt(trainer.processing_class, dataset, tools)
    assert longest == max(len(ids) for ids in tokenized) == len(tokenized[1])
