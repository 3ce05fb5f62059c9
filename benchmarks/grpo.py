"""GRPO: posttrain against the plain TRL script, side by side (the reward compared at every step).

    python -m benchmarks.grpo --quick

Both sides score with the plain script's ``reward_len`` (TRL's quickstart
reward); 8 completions of up to 64 tokens per prompt, one prompt per process
and step. Beside tokens/s, the training loop's (``loop_tokens_per_s``: the
seconds spent generating taken out) and on GPUs its MFU.
"""

from benchmarks import compare, workload

if __name__ == "__main__":
    compare.main(
        "grpo",
        workload.prompt_rows,
        n_rows=1000,
        training={"num_generations": 8, "max_completion_length": 64},
        rewards=[{"function": "benchmarks.plain_trl:reward_len"}],
        per_step="reward",
        tokens="num_tokens",  # TRL's GRPO count: prompts and completions (its batches hold no input_ids)
    )
