"""What a run writes and resumes from: checkpoints and resume, the final model, the disk under output_dir, files
written and judged whole, the run summary, metrics and curves."""
