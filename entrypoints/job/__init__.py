"""The job's life: its runtime (spec to trainer to outputs), processes and their group, sharding strategies, the output-dir lease, errors torchx reads, the trainer callbacks."""
