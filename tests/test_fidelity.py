"""Fidelity against plain TRL: a job through posttrain logs the losses a plain TRL script logs.

Each algorithm runs twice from the same tiny model, data file, seed and
settings: once as ``torchx run -s local_cwd posttrain.<algorithm> -j 1x1``,
once as a TRL script written the way TRL's docs show (in its own process,
with the job's environment: one thread, offline, caches in a temp dir). What
posttrain adds (the process group, its callbacks, ``use_cpu``, ``ddp_timeout``,
``include_num_input_tokens_seen``, ``disable_tqdm``, the tokenizer's padding
side, SFT's padding-free batches, no activation checkpointing where TRL's
default recomputes) must not change a single logged loss: they agree to 1e-5 relative at every step. Both run on CPU (``CUDA_VISIBLE_DEVICES`` empty), as the plain
script's ``use_cpu=True`` does.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
from helpers import (
    REPO,
    assert_succeeded,
    job_env,
    load_template,
    log_history,
    read_json,
    run_template,
)

pytestmark = pytest.mark.e2e

MAX_STEPS = 10
RELATIVE = 1e-5
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}

# The plain TRL script, as TRL's quickstarts write it: build the model, load the data, configure, train.
PLAIN_TRL = """
import json
import sys

from datasets import load_dataset
from transformers import LlamaForCausalLM
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

from posttrain.entrypoints import tiny

settings = json.loads(sys.argv[1])
tokenizer = tiny.build_tokenizer()
model = tiny.build_model(tokenizer, LlamaForCausalLM)
dataset = load_dataset("json", data_files=settings["data"], split="train")

if settings["algorithm"] == "sft":
    training_args = SFTConfig(**settings["training"])
    trainer = SFTTrainer(model=model, args=training_args, train_dataset=dataset, processing_class=tokenizer)
else:
    ref_model = tiny.build_model(tokenizer, LlamaForCausalLM)  # the frozen reference: a second fresh build
    training_args = DPOConfig(**settings["training"])
    trainer = DPOTrainer(
        model=model, ref_model=ref_model, args=training_args, train_dataset=dataset, processing_class=tokenizer
    )
trainer.train()

with open(settings["log_history"], "w") as f:
    json.dump(trainer.state.log_history, f)
"""


def plain_trl(algorithm: str, template: Dict[str, Any], tmp_root: Path) -> List[Dict[str, Any]]:
    """Runs the plain TRL script with the template's settings; its ``trainer.state.log_history``."""
    training = {
        **template["training"],
        "max_steps": MAX_STEPS,
        "output_dir": str(tmp_root / "output"),
        "use_cpu": True,
        "bf16": False,
        "report_to": "none",
    }
    # TRL's default where posttrain's fast path differs: activation checkpointing recomputes the same gradients
    training.pop("activation_checkpointing", None)
    settings = {
        "algorithm": algorithm,
        "data": str(REPO / template["data"]["train"]["path"]),
        "training": training,
        "log_history": str(tmp_root / "log_history.json"),
    }
    script = tmp_root / "plain_trl.py"
    script.write_text(PLAIN_TRL)
    result = subprocess.run(
        [sys.executable, str(script), json.dumps(settings)],
        cwd=tmp_root, env=job_env(tmp_root, **CPU_ONLY), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert_succeeded(result)
    history = read_json(tmp_root / "log_history.json")
    return [entry for entry in history if "train_samples_per_second" not in entry]  # as helpers.log_history


def losses(history: List[Dict[str, Any]]) -> Dict[int, float]:
    return {entry["step"]: entry["loss"] for entry in history if "loss" in entry}


@pytest.mark.parametrize("algorithm", ["sft", "dpo"])
def test_losses_match_plain_trl(algorithm: str, tmp_path: Path) -> None:
    template_path = f"{algorithm}/tiny.yaml"
    template = load_template(template_path)

    output_dir = tmp_path / "posttrain" / "output"
    (tmp_path / "posttrain").mkdir()
    overrides = [f"training.max_steps={MAX_STEPS}"]
    assert_succeeded(run_template(template_path, tmp_path / "posttrain", output_dir, "1x1", overrides, **CPU_ONLY))
    ours = losses(log_history(output_dir))

    (tmp_path / "plain").mkdir()
    theirs = losses(plain_trl(algorithm, template, tmp_path / "plain"))

    assert sorted(ours) == list(range(1, MAX_STEPS + 1)), f"posttrain logged steps {sorted(ours)}"
    assert sorted(theirs) == sorted(ours), f"plain TRL logged steps {sorted(theirs)}, posttrain {sorted(ours)}"
    relative = {step: abs(ours[step] - theirs[step]) / abs(theirs[step]) for step in ours}
    worst = max(relative.values())
    print(f"{algorithm}: max relative loss difference {worst:.3g} over {len(relative)} steps")
    assert worst <= RELATIVE, "\n".join(
        f"step {step}: posttrain {ours[step]!r}, plain TRL {theirs[step]!r}, relative {relative[step]:.3g}"
        for step in sorted(relative)
    )
