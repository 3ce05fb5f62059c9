"""What a run writes and resumes from: checkpoints and resume, files written and judged whole, the run
summary, metrics and curves."""
