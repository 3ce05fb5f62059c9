"""The client's data checks before it submits (``components/spec/local_files.py``): their time on a JSONL file of the
shipped chat rows at several sizes (the checks read at most ``CLIENT_BYTES``; target: well under a second).

    python -m benchmarks.client_checks [--repeats 5]
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from posttrain.components.spec.loading import load_spec
from posttrain.components.spec.local_files import CLIENT_BYTES, local_data_problems

REPO = Path(__file__).resolve().parents[1]
SIZES_MIB = (1, 8, 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = [json.loads(line) for line in (REPO / "templates/data/sft_chat.jsonl").read_text().splitlines()]
    print(f"CLIENT_BYTES: {CLIENT_BYTES / 2**20:.0f} MiB")
    with tempfile.TemporaryDirectory() as scratch:
        for mib in SIZES_MIB:
            path = Path(scratch) / f"{mib}mib.jsonl"
            with path.open("w") as stream:
                while stream.tell() < mib * 2**20:
                    stream.writelines(json.dumps(row) + "\n" for row in rows)
            spec = load_spec(str(REPO / "templates/sft/tiny.yaml"), [f"data.train.path={path}"])
            seconds = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                problems = local_data_problems(spec)
                seconds.append(time.perf_counter() - started)
            assert not problems, problems
            print(
                f"{mib:>3} MiB: median {statistics.median(seconds) * 1000:.0f} ms (min {min(seconds) * 1000:.0f}, "
                f"max {max(seconds) * 1000:.0f}; {args.repeats} runs)"
            )


if __name__ == "__main__":
    main()
