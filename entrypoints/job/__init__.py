"""The job's life: its runtime (spec to trainer to outputs), the processes and their group, the sharding
strategies, the lease on output_dir, the error file torchx reads, the trainer's callbacks."""
