"""The run's runtime, above the rooms it drives: spec to trainer to outputs, the sharding strategies, the trainer's
callbacks."""
