"""A failed job ends with one line: posttrain's launcher around torchrun, and a crash's line and traceback file."""

import json
import re
import signal
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from posttrain.entrypoints import launcher
from posttrain.entrypoints.process import distributed, error_file


def _failure(tmp_path: Path, exitcode: int, message: str = "", rank: int = 0) -> ProcessFailure:
    path = tmp_path / f"error-{rank}.json"
    if message:
        path.write_text(json.dumps({"message": {"message": message, "extraInfo": {"timestamp": "1"}}}))
    return ProcessFailure(local_rank=rank, pid=42, exitcode=exitcode, error_file=str(path))


def test_the_root_cause_is_the_rank_that_said_why_not_one_torchrun_stopped_after_it(tmp_path: Path) -> None:
    line = "posttrain: data.train.path: no such file: x.jsonl"
    stopped = {0: _failure(tmp_path, -signal.SIGTERM, line, 0), 1: _failure(tmp_path, error_file.STOPPED, line, 1)}
    # rank 0 had left the same line when torchrun stopped it
    assert launcher.root_cause(stopped)[0] == 1
    quiet = tmp_path / "no error files"
    killed = {0: _failure(quiet, error_file.CRASHED, rank=0), 1: _failure(quiet, -signal.SIGKILL, rank=1)}
    # rank 0 ended on the lost peer, quietly
    assert launcher.root_cause(killed)[0] == 1
    exited = {0: _failure(quiet, error_file.CRASHED, rank=0), 1: _failure(quiet, 13, rank=1)}
    assert launcher.root_cause(exited)[0] == 1


def test_the_launcher_says_a_crash_and_a_signal_but_not_what_a_rank_said(tmp_path: Path) -> None:
    crash = "posttrain: rank 1 crashed: ValueError: bad (at r.py:3 in f); traceback in out/logs/traceback-rank1.txt"
    assert launcher.failure_line(1, _failure(tmp_path, error_file.CRASHED, crash)) == crash
    assert launcher.failure_line(0, _failure(tmp_path, error_file.STOPPED, "posttrain: data.train: ...")) is None
    # a lost peer: quiet
    assert launcher.failure_line(0, _failure(tmp_path / "none", error_file.CRASHED)) is None
    # os._exit(13) in the user's code
    assert launcher.failure_line(2, _failure(tmp_path / "none", 13)) == (
        "posttrain: rank 2 (pid 42) exited with code 13 without saying why"
    )
    assert launcher.failure_line(3, _failure(tmp_path / "none", -signal.SIGKILL)) == (
        "posttrain: rank 3 (pid 42) was killed by SIGKILL (the system's out-of-memory killer sends it)"
    )


def test_a_crash_is_one_line_naming_the_exception_and_where_its_traceback_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    monkeypatch.delenv(error_file.LAUNCHER_SAYS, raising=False)
    try:
        {}["judge"]
    except KeyError as crash:
        error_file.record_crash(crash, 1, tmp_path / "logs")
    kept = tmp_path / "logs" / "traceback-rank1.txt"
    line = capsys.readouterr().err
    assert re.fullmatch(
        rf"posttrain: rank 1 crashed: KeyError: 'judge' \(at test_launcher.py:\d+ in test_a_crash_\w+\); "
        rf"traceback in {re.escape(str(kept))}\n",
        line,
    ), line
    line = line.strip()
    assert kept.read_text().startswith("Traceback (most recent call last):") and '{}["judge"]' in kept.read_text()
    assert error_file.posttrain_line(json.loads((tmp_path / "error.json").read_text())) == line
    # under posttrain's launcher, which says it once
    monkeypatch.setenv(error_file.LAUNCHER_SAYS, "1")
    (tmp_path / "file").write_text("")
    try:
        raise ValueError("first\nsecond")
    except ValueError as crash:
        # cannot be written: printed instead
        error_file.record_crash(crash, 0, tmp_path / "file" / "logs")
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "posttrain:" not in err


def test_the_run_s_logs_are_kept_in_its_output_directory_where_the_job_made_one(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    argv = ["--nproc_per_node", "2", "-m", "posttrain.entrypoints.sft", "--spec-json"]
    argv.append(json.dumps({"training": {"output_dir": str(output_dir)}}))
    kept = launcher.kept_logs(argv)
    assert kept == output_dir / "logs" and launcher.kept_logs(argv[:3]) is None
    # an evaluation's spec names its output_dir at the top
    evaluation = ["-m", "posttrain.entrypoints.eval", "--spec-json", json.dumps({"output_dir": str(output_dir)})]
    assert launcher.kept_logs(evaluation) == kept
    # this launcher's own
    log_dir = tmp_path / "torchelastic_x"
    # torchrun's layout: <run id>_<random>/attempt_<n>/<local rank>
    rank = log_dir / "job-1_ab12" / "attempt_0" / "1"
    rank.mkdir(parents=True)
    (rank / "stderr.log").write_text("posttrain[1] WARNING ...\n")
    (log_dir / "job-1_cd34" / "attempt_0" / "0").mkdir(parents=True)
    launcher.keep_logs(log_dir, kept)
    # stopped before it made its output directory: nothing of the run to keep beside
    assert not output_dir.exists()
    output_dir.mkdir()
    kept.mkdir()
    # a copy that fails (as on a full disk) is left, the next made
    (kept / "job-1_ab12").write_text("in the way")
    launcher.keep_logs(log_dir, kept)
    assert (kept / "job-1_ab12").read_text() == "in the way" and (kept / "job-1_cd34" / "attempt_0" / "0").is_dir()
    (kept / "job-1_ab12").unlink()
    launcher.keep_logs(log_dir, kept)
    assert (kept / "job-1_ab12" / "attempt_0" / "1" / "stderr.log").read_text() == "posttrain[1] WARNING ...\n"


# ---------------------------------------------------------------- a lost peer: quiet, told by where it came from


def _reward_calling_a_judge(completions: list) -> list:
    # what an HTTP client raises when its server drops
    raise ConnectionResetError(104, "Connection reset by peer")


def _reward_wrapping_it(completions: list) -> list:
    try:
        return _reward_calling_a_judge(completions)
    except ConnectionResetError as error:
        raise RuntimeError("the judge failed") from error


def _reward_failing_while_handling_it(completions: list) -> list:
    try:
        return _reward_calling_a_judge(completions)
    except ConnectionResetError:
        return [{}["score"]]


def _reward_saying_it_in_a_runtime_error(completions: list) -> list:
    # gloo's words, from user code
    raise RuntimeError("[pair.cc:553] Connection closed by peer")


@pytest.mark.parametrize(
    "reward",
    [
        _reward_calling_a_judge,
        _reward_wrapping_it,
        _reward_failing_while_handling_it,
        _reward_saying_it_in_a_runtime_error,
    ],
)
def test_a_users_connection_reset_is_a_crash_not_a_lost_peer_whatever_it_says(
    reward: Callable[[list], list], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(Exception) as raised:
        reward(["a"])
    # the words are there, in the chain
    assert distributed.says_any(raised.value, distributed.PEER_GONE)
    for world_size in ("1", "2"):
        monkeypatch.setenv("WORLD_SIZE", world_size)
        assert not distributed.lost_a_peer(raised.value)


def test_torchs_collective_errors_are_a_lost_peer_only_with_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    # the store's, when the rank holding it ended
    error = dist.DistNetworkError("Connection reset by peer")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert distributed.lost_a_peer(error) and not distributed.lost_a_peer(dist.DistBackendError("out of memory"))
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not distributed.lost_a_peer(error)


def test_a_checks_line_rank_0_was_stopped_before_printing_is_said_by_rank_0s_node_alone(tmp_path: Path) -> None:
    line = "posttrain: distributed.fsdp: this job sees no GPU"
    done = tmp_path / "done"
    done.mkdir()
    # rank 1 ended on the check first (recorded, not printed: rank 0 prints it), and torchrun stopped rank 0
    unsaid = {0: _failure(tmp_path, -signal.SIGTERM, rank=0), 1: _failure(tmp_path, error_file.STOPPED, line, 1)}
    assert launcher.unsaid_line(unsaid, done) == line
    # another node's ranks leave it to rank 0's node
    assert launcher.unsaid_line({2: _failure(tmp_path, error_file.STOPPED, line, 2)}, done) is None
    # rank 0 printed it
    (done / "said-0").touch()
    assert launcher.unsaid_line(unsaid, done) is None
    # and that is no rank's end of a finished run
    assert launcher.unfinished_line(done, ["--nproc_per_node", "1"]) is not None


def test_rank_0_alone_prints_a_checks_line_and_says_so_every_rank_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from posttrain.components.spec.messages import SpecError
    from posttrain.entrypoints.process.ending import ends_in_one_line

    monkeypatch.setenv(error_file.DONE_DIR_ENV, str(tmp_path))
    for rank, printed in (("0", True), ("1", False)):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / f"error-{rank}.json"))
        with pytest.raises(SystemExit), ends_in_one_line():
            raise SpecError(["distributed.fsdp: this job sees no GPU"])
        data = json.loads((tmp_path / f"error-{rank}.json").read_text())
        assert error_file.posttrain_line(data) == "posttrain: distributed.fsdp: this job sees no GPU"
        assert ("posttrain: " in capsys.readouterr().err) is printed
        assert (tmp_path / f"said-{rank}").exists() is printed


def test_a_line_every_rank_of_a_node_meets_alike_is_printed_once_and_recorded_by_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A full disk the ranks share: each rank stops with the same line, said once on the node."""
    from posttrain.components.spec.messages import SpecError
    from posttrain.entrypoints.process.ending import ends_in_one_line

    monkeypatch.setenv(error_file.DONE_DIR_ENV, str(tmp_path))
    line = "training.output_dir: writing into /out failed: No space left on device (0.0 MiB free); make room"
    for rank in ("1", "0", "2"):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / f"error-{rank}.json"))
        with pytest.raises(SystemExit), ends_in_one_line():
            raise SpecError([line], this_rank_only=True)
        assert (
            error_file.posttrain_line(json.loads((tmp_path / f"error-{rank}.json").read_text())) == f"posttrain: {line}"
        )
        assert (tmp_path / f"said-{rank}").exists()
    assert capsys.readouterr().err.count("posttrain: ") == 1
    # another line is said, once
    with pytest.raises(SystemExit), ends_in_one_line():
        raise SpecError(["something else"], this_rank_only=True)
    assert capsys.readouterr().err.count("posttrain: something else") == 1


def test_a_sys_exit_a_rank_says_is_marked_said_and_the_launcher_does_not_say_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from posttrain.entrypoints.process.ending import ends_in_one_line

    monkeypatch.setenv(error_file.DONE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error-0.json"))
    with pytest.raises(SystemExit), ends_in_one_line():
        sys.exit(3)
    assert capsys.readouterr().err.count("posttrain: rank 0: sys.exit(3) was called") == 1
    data = json.loads((tmp_path / "error-0.json").read_text())
    failure = ProcessFailure(
        local_rank=0, pid=1, exitcode=error_file.STOPPED, error_file=str(tmp_path / "error-0.json")
    )
    assert error_file.posttrain_line(data) is not None
    assert launcher.unsaid_line({0: failure}, tmp_path) is None
