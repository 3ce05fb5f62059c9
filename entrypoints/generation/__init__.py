"""Generation: with vLLM, colocated or through the job's vllm role (the trainers' lease on the role, and the
token that guards it); and how posttrain's own generation writes prompts and samples (sampling.py)."""
