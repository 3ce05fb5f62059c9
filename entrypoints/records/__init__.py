"""What a run writes and resumes from: checkpoints and resume, the run summary, metrics and curves."""
