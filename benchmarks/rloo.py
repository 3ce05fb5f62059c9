"""RLOO: posttrain against the plain TRL script, side by side, at GRPO's steps (``benchmarks/grpo.py``).

python -m benchmarks.rloo --quick
python -m benchmarks.rloo --gpu --nproc 1 --repeats 1 --steps 5
"""

from benchmarks import grpo

if __name__ == "__main__":
    grpo.main("rloo")
