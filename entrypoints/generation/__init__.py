"""Generation with vLLM: colocated or through the job's vllm role, the trainers' lease on the role, and the
token that guards it."""
