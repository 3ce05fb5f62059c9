"""PPO for language models: our own trainer (TRL 1.13 removed ``trl.PPOTrainer``).

One iteration (one ``global_step``), following Ziegler et al. (2019), "The N
Implementation Details of RLHF with PPO" (Huang et al., 2023) and InstructGPT:

1. **Rollout**: every rank samples ``per_device_train_batch_size`` prompts,
   left-padded, and generates with the unwrapped policy (no collectives
   inside ``generate``, so ranks may finish at different lengths). Tokens after
   the first EOS are padding and get no loss.
2. **Score**: reward functions and/or reward models score prompt + response
   once (weighted sum); responses without EOS may pay ``missing_eos_penalty``.
   Every response token pays ``kl_coef`` times the KL estimate
   (``kl_estimator``: ``k1`` = logp - logp_ref, unbiased; ``k3`` =
   (q - 1) - log q with q = p_ref / p, non-negative and lower variance);
   the score is added at the last real token.
3. **Advantages**: GAE (``gamma``, ``lam``) backwards over response tokens
   with V after the last token = 0; returns = advantages + values; advantages
   whitened with mean and variance gathered across all ranks.
4. **Update**: ``num_ppo_epochs`` passes over ``num_mini_batches`` shuffled
   mini-batches: clipped policy loss (``cliprange``) plus ``vf_coef`` times the
   clipped value loss (``cliprange_value``), through the DDP-wrapped
   policy-and-value module so gradients are averaged across ranks.
5. **KL control**: fixed ``kl_coef``, or Ziegler's adaptive controller
   (``adaptive_kl`` towards ``kl_target`` over ``kl_horizon`` samples).

Log-probabilities are computed at the sampling temperature, so the ratio and
the KL start at exactly 1 and 0: for that, generation samples from the logits
and the temperature alone (the model's ``generation_config.json`` sampling
defaults, such as an instruct model's repetition penalty or top-k, are set
aside while rolling out), every model runs without dropout (in eval mode,
for the rollout and the update alike, as TRL's PPOv2 disables dropout), and
the reference and reward models run under the same autocast as the policy.
Reward functions and models see each response decoded up to its EOS, never
the padding after it. Plain-text prompts are encoded with the tokenizer's
BOS; chat prompts through the chat template.

Where it differs from TRL's removed PPOv2: gradients are clipped to
``max_grad_norm`` for the policy and the value model separately (PPOv2
clipped nothing; a joint norm lets the value loss's larger gradients shrink
the policy's step); the learning-rate schedule counts optimizer updates
(``max_steps`` x ``num_ppo_epochs`` x ``num_mini_batches``) and steps once
per update on every rank, whatever the number of processes.

Logged each iteration: the metrics ``PPO_METRICS`` lists
(``components/spec/descriptions.py``, the text of ``posttrain.ppo --help``; a
unit test holds this trainer's log to it), ``objective/scores`` the mean reward.

Multi-process rules it keeps: every rank runs the same forward passes,
reductions and barriers in the same order (no rank-0 branches around them);
prompts are drawn deterministically from (seed, iteration), so every rank
takes the same number of iterations and a resume continues the same stream;
only rank 0 writes files, between barriers; what is saved is the unwrapped
policy (and value model), never the DDP wrapper.

The maths is in ``ppo_math.py``, steps 1 to 3 in ``ppo_rollout.py``. Reward
models arrive loaded, with their tokenizers, in the shape TRL's online
trainers take them (``reward_funcs``, ``reward_processing_classes``).

Checkpoints (``checkpoint-N/``) hold the training state (``ppo_model.pt``,
``optimizer.pt``, ``scheduler.pt``, ``ppo_state.json``) and, written last,
``trainer_state.json`` in HF Trainer's format.

Of TrainingArguments it honours what ``PPOSpec.honoured_keys`` (in
``components/spec/registry.py``) lists; the validator refuses the rest, with the
reason. As HF's Trainer does: ``optim``, ``optim_args`` and the Adam fields
through ``Trainer.get_optimizer_cls_and_kwargs``, ``weight_decay`` on all but
biases and norms, ``lr_scheduler_type`` with ``lr_scheduler_kwargs`` and
``warmup_steps`` through ``get_scheduler``, ``report_to`` through the
integration callbacks, ``log_level`` through transformers' logging, and
activation checkpointing (applied in eval mode too, see
:func:`enable_activation_checkpointing`).
"""

import dataclasses
import functools
import json
import math
import time
from pathlib import Path
from typing import Any, Dict, Literal, Optional, Sequence

import torch
import torch.nn as nn
from accelerate import Accelerator
from transformers import PreTrainedModel, Trainer, TrainerControl, TrainerState, TrainingArguments, get_scheduler
from transformers.integrations import get_reporting_integration_callbacks
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.trainer_utils import TrainOutput
from transformers.utils import logging as hf_logging

from posttrain.components.spec.registry import PPOSpec
from posttrain.entrypoints.speed.fast_paths import packs_passes
from posttrain.entrypoints.trainers.ppo_math import (
    adapted_kl_coef,
    masked_mean,
    policy_loss,
    response_logprobs,
    value_loss,
)
from posttrain.entrypoints.trainers.ppo_models import PolicyAndValue
from posttrain.entrypoints.trainers.ppo_rollout import Rollouts


@dataclasses.dataclass
class PPOConfig(TrainingArguments):
    """``training`` for PPO: TrainingArguments plus the PPO settings.

    ``per_device_train_batch_size`` is the number of prompts each rank rolls
    out per iteration; ``max_steps`` counts iterations.
    """

    num_ppo_epochs: int = dataclasses.field(default=4, metadata={"help": "passes over each rollout batch"})
    num_mini_batches: int = dataclasses.field(default=1, metadata={"help": "mini-batches per pass"})
    max_prompt_length: Optional[int] = dataclasses.field(default=128, metadata={"help": "prompt tokens kept (left)"})
    max_completion_length: int = dataclasses.field(default=32, metadata={"help": "response tokens generated"})
    temperature: float = dataclasses.field(default=1.0, metadata={"help": "sampling temperature"})
    kl_coef: float = dataclasses.field(default=0.05, metadata={"help": "KL penalty coefficient (initial if adaptive)"})
    kl_estimator: Literal["k1", "k3"] = dataclasses.field(default="k1", metadata={"help": "per-token KL estimate"})
    adaptive_kl: bool = dataclasses.field(default=False, metadata={"help": "adapt kl_coef towards kl_target"})
    kl_target: float = dataclasses.field(default=6.0, metadata={"help": "target KL of the adaptive controller"})
    kl_horizon: int = dataclasses.field(default=10000, metadata={"help": "horizon of the adaptive controller"})
    gamma: float = dataclasses.field(default=1.0, metadata={"help": "discount"})
    lam: float = dataclasses.field(default=0.95, metadata={"help": "GAE lambda"})
    cliprange: float = dataclasses.field(default=0.2, metadata={"help": "policy ratio clip"})
    cliprange_value: float = dataclasses.field(default=0.2, metadata={"help": "value clip around old values"})
    vf_coef: float = dataclasses.field(default=0.1, metadata={"help": "value loss coefficient"})
    missing_eos_penalty: Optional[float] = dataclasses.field(
        default=None, metadata={"help": "subtracted from the score of responses that never emit EOS"}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        # PPOTrainer draws no progress bar: ProgressLog's lines are its progress
        self.disable_tqdm = True


# ---------------------------------------------------------------- TrainingArguments, honoured as HF's Trainer does


def enable_activation_checkpointing(model: PreTrainedModel, options: Optional[Dict[str, Any]]) -> None:
    """HF's activation checkpointing (``activation_checkpointing_kwargs``), applied in eval mode too.

    HF checkpoints a decoder layer only while the layer is in training mode,
    and this trainer keeps every model in eval mode (no dropout), so HF's
    switch alone would checkpoint nothing. HF still marks the layers (every
    ``every_n_layers``-th) and builds the checkpoint function (``offload``,
    ``use_reentrant``, ...); here each marked layer runs through that function
    whenever gradients are recorded, its forward unchanged (in eval mode).
    """
    kwargs = dict(options or {})
    every_n_layers, offload = kwargs.pop("every_n_layers", 1), kwargs.pop("offload", False)
    model.activation_checkpointing_enable(
        activation_checkpointing_kwargs=kwargs or None, every_n_layers=every_n_layers, offload=offload
    )
    for layer in model.modules():
        if isinstance(layer, GradientCheckpointingLayer) and layer.gradient_checkpointing:
            layer.forward = functools.partial(_checkpointed_forward, layer)


def _checkpointed_forward(layer: GradientCheckpointingLayer, *args: Any, **kwargs: Any) -> Any:
    # HF's: in eval mode the layer's own forward, not checkpointed
    forward = type(layer).forward
    # in training mode HF's forward checkpoints itself
    if torch.is_grad_enabled() and not layer.training:
        return layer._gradient_checkpointing_func(functools.partial(forward, layer, **kwargs), *args)
    return forward(layer, *args, **kwargs)


def create_optimizer(args: TrainingArguments, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer HF's Trainer builds: ``optim`` and ``optim_args`` through its own helper, weight decay apart.

    ``Trainer.get_optimizer_cls_and_kwargs`` reads ``optim``, ``optim_args``,
    ``learning_rate``, the Adam fields and ``optim_target_modules`` (GaLore,
    APOLLO); ``weight_decay`` applies to every weight but biases and norms
    (``Trainer.get_decay_parameter_names``, which uses no Trainer state).
    """
    for key, refused in PPOSpec.refused_values.items():
        value = getattr(args, key)
        # OptimizerNames, SchedulerType
        value = getattr(value, "value", value)
        if value in refused:
            raise ValueError(f"{key}={value!r} is not supported by posttrain's PPO: {refused[value]}")
    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    groups: Any = [
        {"params": [p for name, p in named if name in decay], "weight_decay": args.weight_decay},
        {"params": [p for name, p in named if name not in decay], "weight_decay": 0.0},
    ]
    optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    kwargs = dict(kwargs)
    # GaLore, APOLLO: their own groups over optim_target_modules
    groups = kwargs.pop("params", groups)
    return optimizer_cls(groups, **kwargs)


def every(steps: float, max_steps: int) -> int:
    """``logging_steps``, ``save_steps`` in iterations: below 1 a fraction of ``max_steps`` (as HF's); 0 never."""
    if steps <= 0:
        return 0
    return max(1, math.ceil(max_steps * steps)) if steps < 1 else int(steps)


# ---------------------------------------------------------------- the trainer


class PPOTrainer:
    """PPO with a policy, a frozen reference, a value model and rewards; HF Trainer's outputs.

    It offers what the runtime uses of a Trainer: ``train``, ``save_model``,
    ``state``, ``accelerator``, ``is_world_process_zero``.
    """

    def __init__(
        self,
        policy: PreTrainedModel,
        ref_policy: PreTrainedModel,
        value_model: PreTrainedModel,
        reward_funcs: Sequence[Any],
        reward_processing_classes: Sequence[Optional[Any]],
        reward_weights: Sequence[float],
        args: PPOConfig,
        train_dataset: Any,
        processing_class: Any,
        callbacks: Sequence[Any] = (),
    ) -> None:
        self.args = args
        self.tokenizer = processing_class
        # log_level, log_level_replica, log_on_each_node
        hf_logging.set_verbosity(args.get_process_log_level())
        self.accelerator = Accelerator(cpu=args.use_cpu, mixed_precision=_mixed_precision(args))
        self.device = self.accelerator.device
        # report_to (tensorboard, trackio, wandb, ...) through transformers' own integration callbacks
        self.callbacks = [integration() for integration in get_reporting_integration_callbacks(args.report_to)]
        self.callbacks += list(callbacks)
        self.state = TrainerState(
            is_local_process_zero=self.accelerator.is_local_main_process,
            is_world_process_zero=self.accelerator.is_main_process,
        )
        self.control = TrainerControl()
        self.kl_coef = args.kl_coef
        self.rollouts = Rollouts(
            args,
            processing_class,
            self.accelerator,
            train_dataset,
            ref_policy,
            reward_funcs,
            reward_processing_classes,
            reward_weights,
        )

        for model in (policy, value_model):
            model.config.use_cache = False
            if args.activation_checkpointing:
                enable_activation_checkpointing(model, args.activation_checkpointing_kwargs)
        # padding-free passes where every model keeps the packed sequences apart with varlen kernels
        self.padding_free_passes = all(packs_passes(model) for model in (policy, value_model, ref_policy))
        # eval mode for good: dropout would make the old log-probs, values and KL noisy (KL != 0 at step 1)
        model = PolicyAndValue(policy, value_model, self.padding_free_passes).eval()
        optimizer = create_optimizer(args, model)
        updates = args.max_steps * args.num_ppo_epochs * args.num_mini_batches
        # not through accelerator.prepare: its wrapper steps a scheduler once per process at every call,
        # which with N processes would end the schedule after 1/N of the run
        self.scheduler = get_scheduler(
            args.lr_scheduler_type,
            optimizer,
            num_warmup_steps=args.get_warmup_steps(updates),
            num_training_steps=updates,
            scheduler_specific_kwargs=args.lr_scheduler_kwargs,
        )
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        # schedule-free optimizers step in train mode; others ignore it
        self.optimizer.train()

    # ------------------------------------------------------------ update

    def _update(self, batch: Dict[str, Any], iteration: int) -> Dict[str, float]:
        args = self.args
        size = batch["tokens"].shape[0]
        if size % args.num_mini_batches:
            raise ValueError(
                f"per_device_train_batch_size {size} does not divide into {args.num_mini_batches} mini-batches"
            )
        generator = torch.Generator().manual_seed(args.seed + iteration)
        sums: Dict[str, float] = {}
        updates = 0
        for _ in range(args.num_ppo_epochs):
            for mini in torch.randperm(size, generator=generator).chunk(args.num_mini_batches):
                mini = mini.to(self.device)
                mask = batch["response_mask"][mini]
                logits, values = self.model(batch["tokens"][mini], batch["attention_mask"][mini])
                prompt_length = batch["prompt_length"]
                logprobs, entropy = response_logprobs(logits, batch["tokens"][mini], prompt_length, args.temperature)
                values = values[:, prompt_length - 1 : -1]
                pg_loss, pg_clipfrac = policy_loss(
                    logprobs, batch["logprobs"][mini], batch["advantages"][mini], mask, args.cliprange
                )
                vf_loss, vf_clipfrac = value_loss(
                    values, batch["values"][mini], batch["returns"][mini], mask, args.cliprange_value
                )
                loss = pg_loss + args.vf_coef * vf_loss
                self.accelerator.backward(loss)
                if args.max_grad_norm:
                    self._clip_gradients(args.max_grad_norm)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad()
                approxkl = 0.5 * masked_mean((logprobs - batch["logprobs"][mini]) ** 2, mask)
                for key, value in (
                    ("loss", loss),
                    ("loss/policy", pg_loss),
                    ("loss/value", vf_loss),
                    ("policy/clipfrac", pg_clipfrac),
                    ("val/clipfrac", vf_clipfrac),
                    ("policy/approxkl", approxkl),
                    ("objective/entropy", masked_mean(entropy, mask)),
                ):
                    sums[key] = sums.get(key, 0.0) + value.item()
                updates += 1
        return {key: total / updates for key, total in sums.items()}

    def _clip_gradients(self, max_norm: float) -> None:
        """Clips the policy's and the value model's gradients each to ``max_norm``, apart."""
        # fp16: clip the true gradients
        self.accelerator.unscale_gradients()
        unwrapped = self.accelerator.unwrap_model(self.model)
        for part in (unwrapped.policy, unwrapped.value_model):
            torch.nn.utils.clip_grad_norm_(part.parameters(), max_norm)

    # ------------------------------------------------------------ loop

    def train(self, resume_from_checkpoint: Optional[str] = None) -> TrainOutput:
        if resume_from_checkpoint is not None:
            self._load_checkpoint(Path(resume_from_checkpoint))
        args, state = self.args, self.state
        state.max_steps = args.max_steps
        state.logging_steps, state.save_steps = (
            every(args.logging_steps, args.max_steps),
            every(args.save_steps, args.max_steps),
        )
        self._callback("on_train_begin")
        start, losses = time.time(), []
        for iteration in range(state.global_step, args.max_steps):
            batch = self.rollouts.collect(self.accelerator.unwrap_model(self.model), iteration, self.kl_coef)
            stats = self._update(batch, iteration)
            losses.append(stats["loss"])
            if args.include_num_input_tokens_seen != "no":
                mask = batch["attention_mask"]
                non_padding = args.include_num_input_tokens_seen == "non_padding"
                tokens = (mask.sum() if non_padding else torch.tensor(mask.numel(), device=mask.device)).reshape(1)
                state.num_input_tokens_seen += int(self.accelerator.reduce(tokens, reduction="sum").item())
            rollout_stats = self._rollout_stats(batch)
            if args.adaptive_kl:
                samples = args.per_device_train_batch_size * self.accelerator.num_processes
                self.kl_coef = adapted_kl_coef(
                    self.kl_coef, rollout_stats["objective/kl"], args.kl_target, samples, args.kl_horizon
                )
            state.global_step = iteration + 1
            state.epoch = (
                state.global_step
                * args.per_device_train_batch_size
                * self.accelerator.num_processes
                / len(self.rollouts.prompts)
            )
            if state.global_step == 1 or (state.logging_steps and state.global_step % state.logging_steps == 0):
                self._log({**rollout_stats, **self._mean_across_ranks(stats)})
            self._callback("on_step_end")
            if self.control.should_save or (state.save_steps and state.global_step % state.save_steps == 0):
                self._save_checkpoint()
                # sealed, then the older ones rotated (checkpoints.SealCheckpoints)
                self._callback("on_save")
                self.control.should_save = False
            if self.control.should_training_stop:
                break
        runtime = time.time() - start
        metrics = {"train_runtime": round(runtime, 4), "train_loss": sum(losses) / max(len(losses), 1)}
        state.log_history.append({**metrics, "train_samples_per_second": 0.0, "step": state.global_step})
        self._callback("on_train_end")
        return TrainOutput(state.global_step, metrics["train_loss"], metrics)

    def _rollout_stats(self, batch: Dict[str, Any]) -> Dict[str, float]:
        mask = batch["response_mask"]
        values, returns = batch["values"], batch["returns"]
        local = torch.stack(
            [
                batch["scores"].mean(),
                batch["kl"].mean(),
                batch["non_score_reward"].mean(),
                mask.sum(dim=1).mean(),
            ]
        ).float()
        scores, kl, non_score, length = (self.accelerator.reduce(local, reduction="mean")).tolist()
        residual = masked_mean((returns - values) ** 2, mask) / (
            masked_mean((returns - masked_mean(returns, mask)) ** 2, mask) + 1e-8
        )
        explained = self.accelerator.reduce((1 - residual).reshape(1), reduction="mean").item()
        return {
            "objective/scores": scores,
            "objective/kl": kl,
            "objective/non_score_reward": non_score,
            "objective/kl_coef": self.kl_coef,
            "response_length": length,
            "val/explained_variance": explained,
            "learning_rate": self.scheduler.get_last_lr()[0],
        }

    def _mean_across_ranks(self, stats: Dict[str, float]) -> Dict[str, float]:
        keys = sorted(stats)
        reduced = self.accelerator.reduce(torch.tensor([stats[k] for k in keys], device=self.device), reduction="mean")
        return dict(zip(keys, reduced.tolist()))

    def _log(self, logs: Dict[str, float]) -> None:
        entry = {**logs, "epoch": self.state.epoch, "step": self.state.global_step}
        self.state.log_history.append(entry)
        # ProgressLog prints it, report_to's integrations record it
        self._callback("on_log", logs=logs)

    def _callback(self, event: str, **kwargs: Any) -> None:
        for callback in self.callbacks:
            result = getattr(callback, event)(self.args, self.state, self.control, **kwargs)
            if result is not None:
                self.control = result

    # ------------------------------------------------------------ saving

    def is_world_process_zero(self) -> bool:
        return self.accelerator.is_main_process

    def save_model(self, output_dir: Optional[str] = None) -> None:
        """The policy as a ``from_pretrained`` directory, the tokenizer, and ``value_model/``."""
        directory = Path(output_dir or self.args.output_dir)
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            unwrapped = self.accelerator.unwrap_model(self.model)
            unwrapped.policy.save_pretrained(directory)
            self.tokenizer.save_pretrained(directory)
            unwrapped.value_model.save_pretrained(directory / "value_model")
        self.accelerator.wait_for_everyone()

    def _save_checkpoint(self) -> None:
        directory = Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}"
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            directory.mkdir(parents=True, exist_ok=True)
            torch.save(self.accelerator.unwrap_model(self.model).state_dict(), directory / "ppo_model.pt")
            torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), directory / "scheduler.pt")
            (directory / "ppo_state.json").write_text(json.dumps({"kl_coef": self.kl_coef}))
            self.state.save_to_json(str(directory / "trainer_state.json"))
        self.accelerator.wait_for_everyone()

    def _load_checkpoint(self, directory: Path) -> None:
        state = torch.load(directory / "ppo_model.pt", map_location="cpu", weights_only=True)
        self.accelerator.unwrap_model(self.model).load_state_dict(state)
        self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", map_location="cpu", weights_only=True))
        self.scheduler.load_state_dict(torch.load(directory / "scheduler.pt", map_location="cpu", weights_only=True))
        self.kl_coef = json.loads((directory / "ppo_state.json").read_text())["kl_coef"]
        loaded = TrainerState.load_from_json(str(directory / "trainer_state.json"))
        loaded.is_world_process_zero, loaded.is_local_process_zero = (
            self.state.is_world_process_zero,
            self.state.is_local_process_zero,
        )
        self.state = loaded


def _mixed_precision(args: TrainingArguments) -> str:
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "no"
