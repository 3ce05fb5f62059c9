"""The ``posttrain`` command in process: its commands, each refusal in one line (exit 2), and what each writes."""

import json
from pathlib import Path

import pytest

from helpers import assert_valid_png
from posttrain.components.tools import cli, plot, templates


def test_the_command_lists_its_commands_and_needs_one(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as helped:
        cli.main(["--help"])
    assert helped.value.code == 0 and "{templates,plot}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as bare:
        cli.main([])
    assert bare.value.code == 2 and "required: {templates,plot}" in capsys.readouterr().err


def test_templates_ls_is_the_default_and_cp_writes_a_copy(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["templates"]) == 0
    listed = capsys.readouterr().out
    assert cli.main(["templates", "ls"]) == 0 and capsys.readouterr().out == listed
    assert "sft/tiny " in listed
    assert cli.main(["templates", "cp", "sft/tiny", str(tmp_path / "mine.yaml")]) == 0
    assert capsys.readouterr().out.startswith(f"copied sft/tiny to {tmp_path / 'mine.yaml'}\n")
    assert "algorithm: sft" in (tmp_path / "mine.yaml").read_text()


def test_templates_cp_refuses_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["templates", "cp", "sft/tny", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "posttrain templates cp: no template 'sft/tny'; posttrain templates ls names them: sft/tiny, dpo/tiny, ...\n"
    )
    (tmp_path / "tiny.yaml").write_text("mine")
    assert templates.main(["cp", "sft/tiny", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err
        == f"posttrain templates cp: {tmp_path / 'tiny.yaml'} exists; name another file, or remove it first\n"
    )
    assert (tmp_path / "tiny.yaml").read_text() == "mine"


def test_plot_draws_a_run_and_names_a_directory_without_metrics(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "sft-a"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in (1, 2)))
    assert cli.main(["plot", str(run), "-o", str(tmp_path / "a.png")]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'a.png'}\n"
    assert assert_valid_png(tmp_path / "a.png")["runs"]["sft-a"]["loss"]["value"] == [1.0, 0.5]
    assert plot.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"posttrain plot: {tmp_path}: no metrics.jsonl (written by posttrain jobs)\n"
