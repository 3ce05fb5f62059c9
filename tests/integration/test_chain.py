"""posttrain.chain through the real ``torchx`` CLI: a later stage's typo is refused in one line at submit, and
--dryrun shows every stage. (The rest before it runs: ``tests/unit/components/test_chain.py``.)"""

from pathlib import Path

from helpers import torchx


def test_submit_refuses_a_later_stage_s_typo_in_one_line_and_dryrun_shows_every_stage(tmp_path: Path) -> None:
    args = ["run", "-s", "local_cwd", "--dryrun", "posttrain.chain", "--spec", "templates/chain/rlhf-tiny.yaml"]
    refused = torchx([*args, "stages.ppo.training.kl_cof=0.1"], tmp_path)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        "stages.ppo.training.kl_cof: unknown key; did you mean stages.ppo.training.kl_coef?"
    )
    shown = torchx(args, tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    for output in ("outputs/rlhf-tiny/sft", "outputs/rlhf-tiny/reward", "outputs/rlhf-tiny/ppo"):
        # each stage's validated spec, in the command
        assert output in shown.stdout
    assert "posttrain.entrypoints.chain" in shown.stdout
