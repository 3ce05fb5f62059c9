"""What an evaluation writes in its output_dir (docs: Evaluating), named once for its job and a chain's."""

SPEC_FILE = "eval_spec.json"
# written last: the mark of a finished evaluation
SUMMARY_FILE = "eval_summary.json"
SAMPLES_FILE = "eval_samples.jsonl"
# each prompt's results as they are done, one file per rank; removed once the summary is written
PARTS_DIR = "eval_parts"
PLOT_FILE = "eval.png"
