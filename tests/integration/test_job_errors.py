"""A problem one rank alone sees stops every rank with its message: two gloo ranks, each a process of its own, for a
check before training and for a reward's bad score at a step's end."""

import textwrap
from pathlib import Path

import pytest

from helpers import two_gloo_ranks

pytestmark = pytest.mark.usefixtures("isolated")


TWO_RANKS = textwrap.dedent("""
    import math
    import os
    from datetime import timedelta
    from types import SimpleNamespace
    from posttrain.components.spec.messages import SpecError
    from posttrain.entrypoints.process import distributed
    from posttrain.entrypoints.inputs.rewards import RewardCheck

    distributed.init_process_group(os.environ["BACKEND"], timedelta(seconds=60))
    rank = distributed.env_rank()
    try:
        with distributed.all_ranks_agree():
            if rank == 1:
                raise SpecError(["data.train: only rank 1 sees this"])
        print(f"rank {rank} went on")
    except SpecError as error:
        print(f"rank {rank} stopped: {error}")
    check = RewardCheck()
    check.wrap(lambda completions, **kw: [math.nan if rank == 1 else 1.0], "rewards.0")(completions=["a"])
    try:
        check.on_step_end(None, SimpleNamespace(global_step=3), None)
    except SpecError as error:
        print(f"rank {rank} stopped: {error}")
    distributed.destroy_process_group()
""")


# "cpu:gloo": a group named by device, as posttrain's on GPUs is ("cuda:nccl,cpu:gloo"), whose flags stay on gloo
@pytest.mark.parametrize("backend", ["gloo", "cpu:gloo"])
def test_a_problem_one_rank_alone_sees_stops_every_rank_with_its_message(tmp_path: Path, backend: str) -> None:
    processes = two_gloo_ranks(TWO_RANKS, BACKEND=backend)
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    for rank, output in enumerate(outputs):
        assert f"rank {rank} stopped: data.train: only rank 1 sees this" in output, output
        assert f"rank {rank} stopped: rewards.0 (<lambda>): returned nan at step 3" in output, output
