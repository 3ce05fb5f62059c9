"""Generation with vLLM: colocated or through the job's vllm role, and the token that guards the role."""
