"""GRPO: posttrain against the plain TRL script, side by side (the reward compared at every step).

    python -m benchmarks.grpo --quick
    python -m benchmarks.grpo --gpu --nproc 1 --repeats 1 --steps 5

Both sides score with the plain script's ``reward_len`` (TRL's quickstart
reward). On CPU 8 completions of up to 64 tokens per prompt, one prompt per
process and step. On GPUs a GSM8K-like step: 32 prompts (about 200 tokens,
from 20 to 160 words) of 8 completions of up to 512 tokens, in micro-batches
of 16 rows (16 accumulated), as open recipes train; the same settings on both
sides, each side's own defaults for the rest (posttrain's GPU fast paths,
TRL's ``generate``). Beside tokens/s, the training loop's
(``loop_tokens_per_s``: the seconds spent generating taken out) and on GPUs
its MFU.
"""

from benchmarks import compare, workload

ALGORITHM = "grpo"
CPU_STEP = {"num_generations": 8, "max_completion_length": 64}
GPU_STEP = {
    "num_generations": 8,
    "max_completion_length": 512,
    "per_device_train_batch_size": 16,
    # 256 completions: 32 prompts per step
    "gradient_accumulation_steps": 16,
}


def main(algorithm: str = ALGORITHM) -> None:
    compare.main(
        algorithm,
        workload.prompt_rows,
        n_rows=1000,
        training=CPU_STEP,
        gpu_training=GPU_STEP,
        rewards=[{"function": "benchmarks.plain_trl:reward_len"}],
        per_step="reward",
        # TRL's count: prompts and completions (its batches hold no input_ids)
        tokens="num_tokens",
    )


if __name__ == "__main__":
    main()
