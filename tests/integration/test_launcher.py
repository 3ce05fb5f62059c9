"""A gloo collective that fails because a rank died is a lost peer: two ranks, each a process of its own, one of
which exits."""

import textwrap

from helpers import two_gloo_ranks

A_RANK_DIES = textwrap.dedent("""
    import os
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from posttrain.entrypoints.process import distributed

    distributed.init_process_group("gloo", timedelta(seconds=60))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
    distributed.barrier()
    if distributed.env_rank() == 1:
        os._exit(13)  # its sockets close
    time.sleep(1)
    steps = {
        "backward": lambda: model(torch.ones(1, 2)).sum().backward(),  # DDP all-reduces inside autograd
        "all_reduce": lambda: dist.all_reduce(torch.ones(1)),
    }
    for name, step in steps.items():
        try:
            step()
        except RuntimeError as error:
            print(f"{name}: lost a peer {distributed.lost_a_peer(error)}")
""")


def test_a_gloo_collective_failing_because_a_rank_died_is_a_lost_peer() -> None:
    ranks = two_gloo_ranks(A_RANK_DIES)
    output = ranks[0].communicate(timeout=120)[0]
    assert ranks[1].wait(timeout=60) == 13
    assert "backward: lost a peer True\nall_reduce: lost a peer True\n" in output, output
