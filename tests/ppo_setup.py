"""PPO's trainer on a model shaped like a real one (``builtin:tiny-llama3``), built in process, for the PPO tests."""

from pathlib import Path
from typing import Any, List

from datasets import Dataset
from transformers import LlamaForCausalLM, LlamaForSequenceClassification

from posttrain.entrypoints.inputs import tiny
from posttrain.entrypoints.trainers.ppo_trainer import PPOConfig, PPOTrainer

PROMPTS = [[{"role": "user", "content": text}] for text in ("Say a color.", "Tell me about the sky.")] * 4


def tokenizer() -> Any:
    built = tiny.build_tokenizer_llama3()
    # what the job's loader does for Llama 3
    built.pad_token, built.padding_side = built.eos_token, "left"
    return built


def make_trainer(tmp_path: Path, rewards: List[Any], **training: Any) -> PPOTrainer:
    tok = tokenizer()
    args = PPOConfig(
        **{
            "output_dir": str(tmp_path),
            "use_cpu": True,
            "report_to": [],
            "seed": 0,
            "max_steps": 1,
            "per_device_train_batch_size": 8,
            "num_ppo_epochs": 1,
            "num_mini_batches": 1,
            "max_completion_length": 12,
            **training,
        }
    )
    return PPOTrainer(
        policy=tiny.build_model_llama3(tok, LlamaForCausalLM),
        ref_policy=tiny.build_model_llama3(tok, LlamaForCausalLM),
        value_model=tiny.build_model_llama3(tok, LlamaForSequenceClassification),
        reward_funcs=rewards,
        reward_processing_classes=[None] * len(rewards),
        reward_weights=[1.0] * len(rewards),
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]),
        processing_class=tok,
    )


def length(completions: List[Any], **_: Any) -> List[float]:
    return [float(len(c[0]["content"])) for c in completions]


def mini_batched_trainer(tmp_path: Path, **training: Any) -> PPOTrainer:
    """``make_trainer``'s trainer rewarding ``length``, in two mini-batches."""
    return make_trainer(tmp_path, [length], **{"num_mini_batches": 2, **training})
