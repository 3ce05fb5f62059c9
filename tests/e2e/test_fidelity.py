"""Fidelity against plain TRL: a job through posttrain logs the losses a plain TRL script logs.

Each TRL-based algorithm (all but PPO, posttrain's own trainer) runs twice from
the same tiny model, data file, seed and settings: once as ``torchx run -s
local_cwd posttrain.<algorithm> -j 1x1``, once as a TRL script written the way
TRL's docs show (in its own process, with the job's environment: one thread,
offline, caches in a temp dir). What posttrain adds (the process group, its
callbacks, its checks around each reward function, ``use_cpu``,
``ddp_timeout``, ``include_num_input_tokens_seen``, ``disable_tqdm``,
``reward_weights`` of ones, ``remove_unused_columns: false`` for ORPO, the
tokenizer's padding side and pad token, SFT's padding-free batches, no
activation checkpointing where TRL's default recomputes) must not change a
single logged value: the loss, the gradient norm and each algorithm's own
measures (a reward model's accuracy, the generating algorithms' reward, GRPO's
and RLOO's entropy) agree to 1e-5 relative at every step. The generating
algorithms sample from the same seed, so the same completions. Both run on CPU
(``CUDA_VISIBLE_DEVICES`` empty), as the plain script's ``use_cpu=True`` does.
"""

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
from transformers import LlamaForCausalLM

from helpers import REPO, assert_succeeded, job_env, load_template, log_history, read_json, run_template
from posttrain.entrypoints.inputs import tiny

pytestmark = pytest.mark.e2e

MAX_STEPS = 10
RELATIVE = 1e-5
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}

# What each algorithm's log must agree on besides the loss and the gradient norm: a reward model's accuracy, the
# generating algorithms' mean reward, and GRPO's and RLOO's entropy, the policy's at every step (GRPO's loss is 0
# wherever a group's completions have one length, most steps train nothing while every reward in a group is 0, and
# online DPO's loss is logged to 4 decimals)
MEASURES = {
    "sft": (),
    "dpo": (),
    "reward": ("accuracy",),
    "kto": (),
    "orpo": (),
    "grpo": ("reward", "entropy"),
    "rloo": ("reward", "entropy"),
    "distill": (),
    "online_dpo": ("objective/scores",),
}

# The plain TRL script, as TRL's quickstarts write it: build the model, load the data, configure, train.
PLAIN_TRL = """
import json
import sys

from datasets import load_dataset
from transformers import LlamaForCausalLM, LlamaForSequenceClassification
from trl import (
    DistillationConfig,
    DistillationTrainer,
    DPOConfig,
    DPOTrainer,
    GRPOConfig,
    GRPOTrainer,
    KTOConfig,
    KTOTrainer,
    RewardConfig,
    RewardTrainer,
    RLOOConfig,
    RLOOTrainer,
    SFTConfig,
    SFTTrainer,
)
from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer
from trl.experimental.orpo import ORPOConfig, ORPOTrainer

from posttrain.components.spec.rewards import BUILTIN_REWARDS
from posttrain.entrypoints.inputs import tiny

settings = json.loads(sys.argv[1])
algorithm, training = settings["algorithm"], settings["training"]
build_tokenizer, build_model = tiny.BUILTINS[settings["model"]]
tokenizer = build_tokenizer()
model = build_model(tokenizer, LlamaForSequenceClassification if algorithm == "reward" else LlamaForCausalLM)
dataset = load_dataset("json", data_files=settings["data"], split="train")
reward_funcs = [BUILTIN_REWARDS[reward["builtin"]](**reward["args"]) for reward in settings["rewards"]]

if algorithm == "sft":
    trainer = SFTTrainer(model=model, args=SFTConfig(**training), train_dataset=dataset, processing_class=tokenizer)
elif algorithm == "dpo":
    ref_model = build_model(tokenizer, LlamaForCausalLM)  # the frozen reference: a second fresh build
    trainer = DPOTrainer(
        model=model, ref_model=ref_model, args=DPOConfig(**training), train_dataset=dataset, processing_class=tokenizer
    )
elif algorithm == "reward":
    trainer = RewardTrainer(
        model=model, args=RewardConfig(**training), train_dataset=dataset, processing_class=tokenizer
    )
elif algorithm == "kto":
    ref_model = build_model(tokenizer, LlamaForCausalLM)
    trainer = KTOTrainer(
        model=model, ref_model=ref_model, args=KTOConfig(**training), train_dataset=dataset, processing_class=tokenizer
    )
elif algorithm == "orpo":
    trainer = ORPOTrainer(model=model, args=ORPOConfig(**training), train_dataset=dataset, processing_class=tokenizer)
elif algorithm == "grpo":
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward_funcs, args=GRPOConfig(**training), train_dataset=dataset,
        processing_class=tokenizer,
    )
elif algorithm == "rloo":
    trainer = RLOOTrainer(
        model=model, reward_funcs=reward_funcs, args=RLOOConfig(**training), train_dataset=dataset,
        processing_class=tokenizer,
    )
elif algorithm == "distill":
    trainer = DistillationTrainer(
        model=model, teacher_model=settings["teacher_model"], args=DistillationConfig(**training),
        train_dataset=dataset, processing_class=tokenizer,
    )
else:
    ref_model = build_model(tokenizer, LlamaForCausalLM)
    trainer = OnlineDPOTrainer(
        model=model, ref_model=ref_model, reward_funcs=reward_funcs, args=OnlineDPOConfig(**training),
        train_dataset=dataset, processing_class=tokenizer,
    )
trainer.train()

with open(settings["log_history"], "w") as f:
    json.dump(trainer.state.log_history, f)
"""


def save_teacher(directory: Path) -> None:
    """A distillation teacher unlike the fresh student (whose divergence from it would be 0): the tiny Llama's shape
    from another seed, its weights larger so that its next-token distributions are far from uniform."""
    tokenizer = tiny.build_tokenizer()
    config = tiny.build_model(tokenizer, LlamaForCausalLM).config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        teacher = LlamaForCausalLM(config)
    with torch.no_grad():
        for parameter in teacher.parameters():
            parameter.mul_(10)
    teacher.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def plain_trl(algorithm: str, template: Dict[str, Any], tmp_root: Path, teacher: Path) -> List[Dict[str, Any]]:
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
    rewards = template.get("rewards", [])
    assert all("builtin" in reward for reward in rewards), "the plain script builds built-in rewards only"
    settings = {
        "algorithm": algorithm,
        "model": template["model"]["name_or_path"],
        "teacher_model": str(teacher),
        "data": str(REPO / template["data"]["train"]["path"]),
        "rewards": rewards,
        "training": training,
        "log_history": str(tmp_root / "log_history.json"),
    }
    script = tmp_root / "plain_trl.py"
    script.write_text(PLAIN_TRL)
    result = subprocess.run(
        [sys.executable, str(script), json.dumps(settings)],
        cwd=tmp_root,
        env=job_env(tmp_root, **CPU_ONLY),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert_succeeded(result)
    history = read_json(tmp_root / "log_history.json")
    # as helpers.log_history
    return [entry for entry in history if "train_samples_per_second" not in entry]


def by_step(history: List[Dict[str, Any]], key: str) -> Dict[int, float]:
    return {entry["step"]: entry[key] for entry in history if key in entry}


def relative_difference(ours: float, theirs: float) -> float:
    """``|ours - theirs|`` relative to the larger; 0 where they are equal (a reward or a loss can be exactly 0)."""
    return 0.0 if ours == theirs else abs(ours - theirs) / max(abs(ours), abs(theirs))


@pytest.mark.parametrize("algorithm", list(MEASURES))
def test_losses_match_plain_trl(algorithm: str, tmp_path: Path) -> None:
    template_path = f"{algorithm}/tiny.yaml"
    template = load_template(template_path)
    # distillation's; the template's is an SFT run's output
    teacher = tmp_path / "teacher"
    overrides = [f"training.max_steps={MAX_STEPS}"]
    if algorithm == "distill":
        save_teacher(teacher)
        overrides.append(f"teacher_model={teacher}")

    output_dir = tmp_path / "posttrain" / "output"
    (tmp_path / "posttrain").mkdir()
    (tmp_path / "plain").mkdir()
    # both at once: each is one process on one thread, its time mostly imports
    with ThreadPoolExecutor(max_workers=1) as pool:
        plain = pool.submit(plain_trl, algorithm, template, tmp_path / "plain", teacher)
        assert_succeeded(run_template(template_path, tmp_path / "posttrain", output_dir, "1x1", overrides, **CPU_ONLY))
        theirs = plain.result()
    ours = log_history(output_dir)

    failures = []
    for key in ("loss", "grad_norm", *MEASURES[algorithm]):
        ours_by_step, theirs_by_step = by_step(ours, key), by_step(theirs, key)
        steps = sorted(ours_by_step)
        assert steps == list(range(1, MAX_STEPS + 1)), f"posttrain logged {key} at steps {steps}"
        assert sorted(theirs_by_step) == steps, f"plain TRL logged {key} at steps {sorted(theirs_by_step)}"
        relative = {step: relative_difference(ours_by_step[step], theirs_by_step[step]) for step in ours_by_step}
        print(f"{algorithm}: max relative {key} difference {max(relative.values()):.3g} over {len(relative)} steps")
        failures += [
            f"step {step} {key}: posttrain {ours_by_step[step]!r}, plain TRL {theirs_by_step[step]!r}, "
            f"relative {relative[step]:.3g}"
            for step in sorted(relative)
            if relative[step] > RELATIVE
        ]
    assert not failures, "\n".join(failures)
