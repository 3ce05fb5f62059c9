"""SFT: posttrain against the plain TRL script, side by side.

python -m benchmarks.sft --quick          # one process, 2 repeats: under 10 minutes on 2 CPU cores
python -m benchmarks.sft                  # -j 1x1 and 1x2, 3 repeats each
python -m benchmarks.sft --gpu --nproc 1  # a 0.5B model on a GPU, with MFU
"""

from benchmarks import compare, workload

if __name__ == "__main__":
    compare.main("sft", workload.chat_rows, n_rows=3000)
