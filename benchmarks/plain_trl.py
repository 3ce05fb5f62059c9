"""The plain TRL script the benchmarks compare against, written the way TRL's docs show.

    python -m torch.distributed.run --nproc_per_node 2 benchmarks/plain_trl.py SETTINGS.json

Load the model and the data, configure, train, and destroy the process group
as PyTorch asks. Two additions: the measurement (rank 0 appends every log to
``metrics.jsonl`` with a wall-clock ``time``, the file and the fields
posttrain's runs write), and a pause after the group is gone that keeps a
rank from aborting at exit (it comes after every figure is taken).
"""

import json
import sys
import time

import torch.distributed as dist
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer, SFTConfig, SFTTrainer


class StepLog(TrainerCallback):
    def __init__(self, path: str) -> None:
        self.path = path

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "train_samples_per_second" not in logs:
            with open(self.path, "a") as file:
                file.write(json.dumps({**logs, "step": state.global_step, "time": time.time()}) + "\n")


def reward_len(completions, **kwargs):
    """TRL's quickstart reward, for chat completions: 20 characters score best. posttrain's GRPO spec names it too."""
    return [-abs(20 - len(completion[0]["content"])) for completion in completions]


def main() -> None:
    with open(sys.argv[1]) as file:
        settings = json.load(file)
    model = AutoModelForCausalLM.from_pretrained(settings["model"], dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(settings["model"])
    dataset = load_dataset("json", data_files=settings["data"], split="train")
    callbacks = [StepLog(settings["metrics"])]
    if settings["algorithm"] == "sft":
        trainer = SFTTrainer(
            model=model,
            args=SFTConfig(**settings["training"]),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=callbacks,
        )
    elif settings["algorithm"] == "dpo":
        trainer = DPOTrainer(
            model=model,
            args=DPOConfig(**settings["training"]),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=callbacks,
        )
    else:
        trainer_class, config_class = (
            (RLOOTrainer, RLOOConfig) if settings["algorithm"] == "rloo" else (GRPOTrainer, GRPOConfig)
        )
        trainer = trainer_class(
            model=model,
            reward_funcs=reward_len,
            args=config_class(**settings["training"]),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=callbacks,
        )
    trainer.train()
    # as PyTorch asks
    if dist.is_initialized():
        dist.destroy_process_group()
        # gloo's threads free their last tensors before the interpreter exits, else a rank sometimes aborts there
        # (SIGABRT after training): what posttrain's distributed.destroy_process_group does, and says why
        time.sleep(0.1)


if __name__ == "__main__":
    main()
