"""What a run reads: data sets, models and tokenizers, chat templates, the built-in tiny models, reward functions."""
