"""Resume with real processes and a real disk: two gloo ranks resume from rank 0's choice, and a file system without
room for one checkpoint is refused before any model loads (a 2 MiB tmpfs: needs root)."""

import textwrap
from pathlib import Path

import pytest

from helpers import sft_spec, two_gloo_ranks
from posttrain.components.spec.loading import SpecError
from posttrain.entrypoints.process.distributed import rank0s
from posttrain.entrypoints.records.disk import check_room

RANK0S = textwrap.dedent("""
    import os
    from datetime import timedelta
    from posttrain.entrypoints.process import distributed

    distributed.init_process_group("gloo", timedelta(seconds=60))
    print("chose", distributed.rank0s(f"checkpoint-{10 * (distributed.env_rank() + 1)}"))
    distributed.destroy_process_group()
""")


def test_every_rank_resumes_from_rank_0s_choice() -> None:
    # no process group: this process's own
    assert rank0s("checkpoint-10") == "checkpoint-10"
    for process in two_gloo_ranks(RANK0S):
        assert "chose checkpoint-10" in process.communicate(timeout=120)[0]


def test_a_file_system_without_room_for_one_checkpoint_is_refused_before_any_model_loads(
    tmp_path: Path, small_disk: Path
) -> None:
    import torch
    from safetensors.torch import save_file

    model = tmp_path / "model"
    model.mkdir()
    # 0.8 MB: 2.4 MB with Adam's state
    save_file({"weight": torch.zeros(200_000)}, str(model / "model.safetensors"))
    spec = sft_spec(tmp_path, model={"name_or_path": str(model)})
    with pytest.raises(SpecError) as error:
        check_room(small_disk / "out", spec.model, saves_checkpoints=True)
    assert str(error.value) == (
        f"training.output_dir: {small_disk / 'out'} has 2.0 MiB free; one checkpoint (the weights and the optimizer's "
        f"state) of {model} needs about 2.3 MiB: make room, or use another output_dir"
    )
    # the final weights alone fit
    check_room(small_disk / "out", spec.model, saves_checkpoints=False)
