"""One run per output directory: the lease in this process, held and given back, an unreadable one held, a holder
whose process id another process has gone, and the refusal's line. (Real processes holding it:
``tests/integration/test_lease.py``.)"""

import os
from pathlib import Path

import pytest

from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.process import lease
from posttrain.entrypoints.process.lease import LEASE_FILE, Holder, acquire, alive_at_once, gone_at_once, read_holder

pytestmark = pytest.mark.usefixtures("short_intervals")


def test_a_lease_is_held_while_its_run_lives_and_given_back_with_the_directory_it_made(tmp_path: Path) -> None:
    output_dir = tmp_path / "new" / "out"
    held = acquire(output_dir)
    holder = read_holder(output_dir)
    assert (holder.pid, holder.token, holder.process_space) == (os.getpid(), held.holder.token, lease.process_space())
    held.release()
    # the run made it and wrote nothing else
    assert not (tmp_path / "new" / "out").exists()
    output_dir.mkdir()
    (output_dir / "model.safetensors").write_text("kept")
    acquire(output_dir).release()
    assert sorted(p.name for p in output_dir.iterdir()) == ["model.safetensors"]


def test_a_holder_whose_process_id_was_given_to_another_process_is_gone(tmp_path: Path) -> None:
    me = Holder.this_process()
    parent = Holder(**{**vars(me), "pid": os.getppid(), "pid_start": lease.process_start(os.getppid())})
    # alive here: refused at once
    assert alive_at_once(parent, me) and gone_at_once(parent, me) is None
    # that id, an earlier process's
    reused = Holder(**{**vars(parent), "pid_start": parent.pid_start - 1})
    assert not alive_at_once(reused, me)
    assert gone_at_once(reused, me).endswith("held it, and that process is gone")


def test_a_lease_that_cannot_be_read_is_held(tmp_path: Path) -> None:
    # exists, and reading it fails (as EACCES or ESTALE would)
    (tmp_path / LEASE_FILE).mkdir()
    with pytest.raises(SpecError, match=r"holds a lease \(\.posttrain_lease\.json\) this run cannot read \("):
        acquire(tmp_path)


def test_a_refusal_says_the_directory_is_another_runs_and_other_output_dir_lines_do_not() -> None:
    held = lease._held_error(Path("/out"), "training.output_dir", Holder.this_process())
    assert lease.says_not_this_runs(f"posttrain: {held}")
    # an evaluation's directory is its spec's output_dir
    held = lease._held_error(Path("/out"), "output_dir", Holder.this_process())
    assert str(held).startswith("output_dir: /out is held by") and lease.says_not_this_runs(f"posttrain: {held}")
    assert lease.says_not_this_runs("posttrain: training.output_dir: /out was taken over by job x; this job stops")
    assert not lease.says_not_this_runs("posttrain: training.output_dir: /out holds a finished run")
    assert not lease.says_not_this_runs(None)
