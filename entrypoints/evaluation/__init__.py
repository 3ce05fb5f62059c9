"""posttrain.eval's job: sampling completions of held-out prompts, scoring them, and what the scores say."""
