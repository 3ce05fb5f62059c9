"""Every algorithm in words, once: what it is, when to use it, what it reads, loads, logs, saves and refuses.

One :class:`Description` per algorithm, keyed like ``registry.SPEC_CLASSES``, is the text of three places:
the component's docstring (``torchx run posttrain.<algorithm> --help``; ``arguments.component`` sets it), the
reference page's "What it does" (``generate/reference.py``), and, by a pointer here, the entrypoint's docstring.
:func:`facts` adds what the spec class already says (its config class, its rewards, its vLLM role, its fast
paths), so those are never written twice. Literals are reST's (double backquotes); each place renders them.
"""

import dataclasses
from typing import Dict, List, Tuple

from posttrain.components.spec.registry import SPEC_CLASSES
from posttrain.components.spec.rewards import BUILTIN_REWARDS


@dataclasses.dataclass(frozen=True)
class Description:
    """An algorithm's text; each field is one paragraph or line of it."""

    # one sentence: what it is and which trainer runs it
    summary: str
    # when to use it, and how it works
    use: str
    # the rows it reads
    data: str
    # the metrics it logs
    logs: Tuple[str, ...]
    # torchx commands, the tiny template first
    examples: Tuple[str, ...]
    # the models it loads beside the one it trains
    models: str = ""
    # what the metric names alone do not say
    logs_note: str = ""
    # what else to know of what it writes (every job: the model, trainer_state.json, run_summary.json)
    saves: str = ""
    # the keys and sections it refuses, with why (the full list: the reference page)
    refuses: str = ""


# What posttrain's PPO trainer logs each iteration (entrypoints/trainers/ppo_trainer.py; a unit test holds its
# log to this list).
PPO_METRICS: Tuple[str, ...] = (
    "objective/scores",
    "objective/kl",
    "objective/kl_coef",
    "objective/non_score_reward",
    "objective/entropy",
    "loss",
    "loss/policy",
    "loss/value",
    "policy/approxkl",
    "policy/clipfrac",
    "val/clipfrac",
    "val/explained_variance",
    "response_length",
    "learning_rate",
)

# the reference of the algorithms built on ReferenceSpec (its problems() refuses reference_model with LoRA)
_REFERENCE = (
    "the frozen reference: ``reference_model`` (a path or hub id), else a second load of the model; with "
    "``model.lora``, the model with its adapter disabled."
)
_PREFERENCE_DATA = "``prompt``, ``chosen`` and ``rejected`` rows (or ``chosen`` and ``rejected`` alone)"
# a fast path (entrypoints/speed/fast_paths.py) in words
_FAST_PATHS: Dict[str, str] = {
    "padding_free": "padding-free batches",
    "use_liger_kernel": "Liger kernels on GPUs",
    "gpu_batch": "larger batches on GPUs where they fit",
    "no_activation_checkpointing": "no activation checkpointing where the memory allows",
    "micro_batches": "micro-batches on GPUs where a step's rows would not fit",
    "rollout_generator": "rollouts without vLLM where finished rows leave the batch",
}

# what the job runs where the spec leaves a fast path's keys unset (entrypoints/speed/fast_paths.py decides), by fast
# path and key: the reference's default column shows it (a training key's beside TRL's default)
FAST_PATH_DEFAULTS: Dict[str, Dict[str, str]] = {
    "padding_free": {
        "training.padding_free": "true on CPU; on GPUs, true with varlen attention (torch_varlen, chosen where "
        "torch 2.11+ runs it; flash attention)",
        "model.attn_implementation": "on GPUs, torch_varlen where torch 2.11+ runs it, for the model types it is "
        "checked for, in 16 bits (docs, Speed); else the model's own",
    },
    "use_liger_kernel": {"training.use_liger_kernel": "true on CUDA where liger-kernel is installed (the gpu extra)"},
    "gpu_batch": {
        "training.per_device_train_batch_size": "on GPUs, 65,536 tokens over max_length (64 rows of 1,024) where "
        "the step fits with Liger's fused loss; else 8",
    },
    "micro_batches": {
        "training.gradient_accumulation_steps": "on GPUs without FSDP or DeepSpeed, where a step's rows would not "
        "fit: per_device_train_batch_size split into the fewest equal micro-batches that do (same loss and steps; "
        "not with bnpo or an entropy bonus); else 1",
    },
    "rollout_generator": {
        "generation.rollout_generator": "true: without vLLM, posttrain's rollout generator where it decodes the "
        "generation settings (else transformers' generate, said in the first lines)",
    },
    "no_activation_checkpointing": {
        "training.activation_checkpointing": "false on CPU; on GPUs without FSDP or DeepSpeed, false where the "
        "step's activations fit",
        "training.gradient_checkpointing": "as activation_checkpointing (its old name)",
    },
}

DESCRIPTIONS: Dict[str, Description] = {
    "sft": Description(
        summary="Supervised fine-tuning of a causal LM on chat or text data with ``trl.SFTTrainer``, as TRL's "
        "``trl/scripts/sft.py``.",
        use="Use it to teach a base model a format or a task from demonstrations, and as the first stage of an "
        "RLHF chain (SFT, then reward model, then PPO).",
        data="``messages`` (chat), ``text``, or ``prompt`` and ``completion`` rows.",
        logs=("loss", "entropy", "mean_token_accuracy", "num_tokens"),
        refuses="``dataset_kwargs`` (the trainer tokenizes the rows itself); ``dataset_text_field`` is posttrain's "
        "(map a column to ``text`` with ``data.columns``).",
        examples=(
            "torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml",
            "torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml -j 1x2 training.max_steps=20",
            "torchx run -s slurm posttrain.sft --spec templates/sft/qwen2.5-0.5b.yaml -j 2x8 -h gpu.h100.8",
        ),
    ),
    "dpo": Description(
        summary="Direct preference optimisation of a causal LM on chosen/rejected pairs with ``trl.DPOTrainer``, "
        "as TRL's ``trl/scripts/dpo.py``.",
        use="Use it after SFT to prefer chosen over rejected answers without a reward model.",
        data=f"{_PREFERENCE_DATA}, as text or chat messages.",
        models=_REFERENCE,
        logs=(
            "loss",
            "rewards/chosen",
            "rewards/rejected",
            "rewards/accuracies",
            "rewards/margins",
            "logps/chosen",
            "logps/rejected",
            "logits/chosen",
            "logits/rejected",
        ),
        refuses="``padding_free`` (TRL 1.16's DPOTrainer turns it off with a warning).",
        examples=(
            "torchx run -s local_cwd posttrain.dpo --spec templates/dpo/tiny.yaml",
            "torchx run -s slurm posttrain.dpo --spec templates/dpo/ultrafeedback.yaml -j 2x8 -h gpu.h100.8",
        ),
    ),
    "reward": Description(
        summary="Reward modelling with ``trl.RewardTrainer``, as TRL's ``trl/scripts/reward.py``: a "
        "sequence-classification head learns to score the chosen answer above the rejected one.",
        use="Use it to train the reward model of an RLHF chain (SFT, reward model, then PPO scored by it).",
        data=f"{_PREFERENCE_DATA}.",
        models="the model is loaded with ``AutoModelForSequenceClassification`` (a one-label classification head); "
        "LoRA trains it as ``SEQ_CLS``.",
        logs=("loss", "accuracy", "margin", "mean_reward", "min_reward", "max_reward"),
        saves="the model loads with ``AutoModelForSequenceClassification``.",
        examples=(
            "torchx run -s local_cwd posttrain.reward --spec templates/reward/tiny.yaml",
            "torchx run -s slurm posttrain.reward --spec templates/reward/qwen2.5-0.5b.yaml -j 1x8 -h gpu.h100.8",
        ),
    ),
    "kto": Description(
        summary="Kahneman-Tversky optimisation on unpaired desirable and undesirable answers with "
        "``trl.KTOTrainer``, as TRL's ``trl/scripts/kto.py``.",
        use="Use it when feedback is a thumbs up or down per answer rather than a pair.",
        data="``prompt``, ``completion`` and ``label`` rows (``label`` true: desirable).",
        models=_REFERENCE,
        logs=("loss", "kl", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected"),
        examples=(
            "torchx run -s local_cwd posttrain.kto --spec templates/kto/tiny.yaml",
            "torchx run -s slurm posttrain.kto --spec templates/kto/qwen2.5-0.5b.yaml -j 1x8 -h gpu.h100.8",
        ),
    ),
    "orpo": Description(
        summary="Odds-ratio preference optimisation with ``trl.experimental.orpo.ORPOTrainer``: SFT and preference "
        "in one loss, no reference model.",
        use="Use it to align a base model in one stage, with no reference model.",
        data=f"{_PREFERENCE_DATA}.",
        logs=(
            "loss",
            "nll_loss",
            "log_odds_ratio",
            "log_odds_chosen",
            "rewards/chosen",
            "rewards/rejected",
            "rewards/accuracies",
            "rewards/margins",
        ),
        refuses="``remove_unused_columns`` (ORPO's collator needs every column; posttrain sets it to false, as "
        "TRL's trainer would whatever it is).",
        examples=(
            "torchx run -s local_cwd posttrain.orpo --spec templates/orpo/tiny.yaml",
            "torchx run -s slurm posttrain.orpo --spec templates/orpo/qwen2.5-0.5b.yaml -j 1x8 -h gpu.h100.8",
        ),
    ),
    "grpo": Description(
        summary="Group relative policy optimisation with ``trl.GRPOTrainer``, as TRL's ``trl/scripts/grpo.py``; "
        "GSPO is ``importance_sampling_level: sequence``.",
        use="Use it to raise a reward on generated completions without a value model: each prompt gets "
        "``num_generations`` completions, each scored by the rewards and compared within its group. With "
        "``tools`` or an ``environment`` (a class per rollout: its methods are the tools, its ``get_reward`` may "
        "score it), the model may call them while it answers: TRL runs each call and puts its result in the "
        "conversation (up to ``max_tool_calling_iterations`` rounds); the results are not trained on.",
        data="``prompt`` rows (and the columns the rewards read); with ``tools`` or an ``environment``, prompts as "
        "chat messages.",
        logs=(
            "reward",
            "reward_std",
            "rewards/<name>/mean",
            "kl",
            "entropy",
            "completions/mean_length",
            "clip_ratio/*",
            "tools/call_frequency",
            "tools/failure_frequency",
        ),
        logs_note="``kl`` only with ``beta`` > 0; ``tools/*`` only with ``tools`` or an ``environment`` (calls per completion, failed "
        "calls per call).",
        examples=(
            "torchx run -s local_cwd posttrain.grpo --spec templates/grpo/tiny.yaml",
            "torchx run -s local_cwd posttrain.grpo --spec templates/grpo/gspo-tiny.yaml",
            "torchx run -s local_cwd posttrain.grpo --spec templates/grpo/tiny-vllm-server.yaml",
            "torchx run -s slurm posttrain.grpo --spec templates/grpo/gsm8k.yaml -j 2x8 -h gpu.h100.8",
        ),
    ),
    "rloo": Description(
        summary="REINFORCE leave-one-out with ``trl.RLOOTrainer``, as TRL's ``trl/scripts/rloo.py``: each "
        "completion's baseline is the mean reward of the other completions of its prompt.",
        use="Use it to raise a reward on generated completions without a value model, with an unbiased baseline: "
        "each prompt gets ``num_generations`` completions, each scored against the mean reward of the others.",
        data="``prompt`` rows (and the columns the rewards read).",
        logs=("reward", "reward_std", "rewards/<name>/mean", "kl", "entropy", "completions/mean_length"),
        logs_note="``kl`` only with ``beta`` > 0.",
        examples=(
            "torchx run -s local_cwd posttrain.rloo --spec templates/rloo/tiny.yaml",
            "torchx run -s slurm posttrain.rloo --spec templates/rloo/gsm8k.yaml -j 2x8 -h gpu.h100.8",
        ),
    ),
    "ppo": Description(
        summary="Proximal policy optimisation with posttrain's own trainer "
        "(``posttrain.entrypoints.trainers.ppo_trainer``; TRL 1.x has none).",
        use="Use it for classic RLHF: an SFT policy, a frozen reference, a value model and a reward (a reward model "
        "from ``posttrain.reward`` and/or functions), with a KL penalty (fixed or adaptive), GAE, and clipped "
        "policy and value losses over several PPO epochs per rollout batch.",
        data="``prompt`` rows (and the columns the rewards read).",
        models="the policy; the frozen reference (``reference_model``, else a second load of the policy); the value "
        "model (``value_model``, else the reward model where the rewards hold exactly one, else the policy's "
        "weights with a fresh score head).",
        logs=PPO_METRICS,
        saves="the model is the policy, with ``value_model/`` beside it.",
        refuses="every field of ``PPOConfig`` the trainer does not honour, each with its reason "
        "(``PPOSpec.refused_keys``); ``model.lora`` (it trains full weights), ``distributed.deepspeed`` and "
        "``distributed.fsdp`` (it runs on DDP), ``data.eval`` (it does not evaluate: its logs score every rollout).",
        examples=(
            "torchx run -s local_cwd posttrain.ppo --spec templates/ppo/tiny.yaml",
            "torchx run -s slurm posttrain.ppo --spec templates/ppo/tldr.yaml -j 1x8 -h gpu.h100.8",
        ),
    ),
    "distill": Description(
        summary="On-policy distillation of ``teacher_model`` into the model with ``trl.DistillationTrainer``.",
        use="Use it to pass a stronger model's behaviour to a smaller one of the same tokenizer: the student "
        "generates completions of each prompt and learns the teacher's next-token distributions on them (the "
        "generalised Jensen-Shannon divergence, ``training.beta``).",
        data="``prompt`` rows.",
        models="``teacher_model`` (a path or hub id), loaded like the model (same dtype and options) and frozen; "
        "it must share the model's tokenizer.",
        logs=("loss", "entropy", "completions/mean_length"),
        refuses="``teacher_model_name_or_path``, ``teacher_model_revision`` and ``teacher_model_init_kwargs`` "
        "(posttrain's: use ``teacher_model`` at the top of the spec); ``max_tool_calling_iterations`` (the student "
        "is given no tools).",
        examples=(
            "torchx run -s local_cwd posttrain.sft --spec templates/sft/tiny.yaml",
            "torchx run -s local_cwd posttrain.distill --spec templates/distill/tiny.yaml",
            "torchx run -s slurm posttrain.distill --spec templates/distill/qwen2.5-1.5b-to-0.5b.yaml -j 1x8 "
            "-h gpu.h100.8",
        ),
    ),
    "online_dpo": Description(
        summary="Online DPO with ``trl.experimental.online_dpo.OnlineDPOTrainer``: preference pairs sampled and "
        "scored as it trains.",
        use="Use it where you can score answers but have no preference data: the model samples two completions "
        "of each prompt, the rewards score them, and DPO's loss prefers the better one against the reference.",
        data="``prompt`` rows (and the columns the rewards read).",
        models=_REFERENCE,
        logs=(
            "loss",
            "objective/scores",
            "objective/scores_margin",
            "objective/kl",
            "objective/entropy",
            "rewards/chosen",
            "rewards/rejected",
            "rewards/margins",
        ),
        refuses="evaluation (``data.eval``, ``eval_*``: TRL's trainer runs the model's forward on prompt rows, "
        "which fails); ``remove_unused_columns`` (false, TRL's default, is what its prompt rows need); "
        "``reward_model_path`` (use ``rewards: [{model: ...}]``).",
        examples=(
            "torchx run -s local_cwd posttrain.online_dpo --spec templates/online_dpo/tiny.yaml",
            "torchx run -s slurm posttrain.online_dpo --spec templates/online_dpo/qwen2.5-0.5b.yaml -j 1x8 "
            "-h gpu.h100.8",
        ),
    ),
}


def facts(algorithm: str) -> List[Tuple[str, str]]:
    """The labelled lines of an algorithm's text, between its use and its examples: ``(label, text)``."""
    text, cls = DESCRIPTIONS[algorithm], SPEC_CLASSES[algorithm]
    found = [("Data", text.data), ("Models", text.models)]
    if "rewards" in cls.model_fields:
        builtins = " | ".join(BUILTIN_REWARDS)
        found.append(
            (
                "Rewards",
                "``rewards``, each with a ``weight``: user functions (``function: module:callable``), built-ins "
                f"(``builtin: {builtins}``) and reward models (``model: <path or hub id>``). Every reward's scores "
                "are checked at each step's end (``rewards.RewardCheck``): a NaN or a wrong count stops the job with "
                "one line.",
            )
        )
    found.append(("Training", f"``training`` holds the fields of ``{cls.config_class.replace(':', '.')}``."))
    if cls.vllm_role:
        found.append(
            (
                "Generation",
                "transformers' ``generate``, or vLLM (``training.use_vllm``); ``vllm_mode: server`` adds the job's "
                "``vllm`` role, sized by ``--vllm_*``.",
            )
        )
    if cls.fast_paths:
        ways = ", ".join(_FAST_PATHS[name] for name in cls.fast_paths)
        found.append(("Fast paths", f"{ways}; each where the spec leaves its keys unset (docs: Speed)."))
    logs = ", ".join(f"``{metric}``" for metric in text.logs)
    found.append(("Logs", f"{logs}. {text.logs_note}".strip()))
    saved = "the model, ``trainer_state.json`` and ``run_summary.json``, in ``training.output_dir``"
    found.append(("Saves", f"{saved}; {text.saves}" if text.saves else f"{saved}."))
    found.append(("Refuses", text.refuses))
    return [(label, line) for label, line in found if line]
