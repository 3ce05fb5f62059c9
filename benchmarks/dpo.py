"""DPO: posttrain against the plain TRL script, side by side.

python -m benchmarks.dpo --quick
python -m benchmarks.dpo
python -m benchmarks.dpo --gpu --nproc 1
"""

from benchmarks import compare, workload

if __name__ == "__main__":
    compare.main("dpo", workload.preference_rows, n_rows=2000)
