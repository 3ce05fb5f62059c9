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
the KL start at exactly 1 and 0. Logged each iteration: ``objective/scores``
(mean reward), ``objective/kl``, ``objective/entropy``, ``objective/kl_coef``,
``loss/policy``, ``loss/value``, ``policy/clipfrac``, ``policy/approxkl``,
``val/clipfrac``, ``val/explained_variance``, ``response_length``.

Multi-process rules it keeps: every rank runs the same forward passes,
reductions and barriers in the same order (no rank-0 branches around them);
prompts are drawn deterministically from (seed, iteration), so every rank
takes the same number of iterations and a resume continues the same stream;
only rank 0 writes files, between barriers; what is saved is the unwrapped
policy (and value model), never the DDP wrapper.

Checkpoints (``checkpoint-N/``) hold the training state (``ppo_model.pt``,
``optimizer.pt``, ``scheduler.pt``, ``ppo_state.json``) and, written last,
``trainer_state.json`` in HF Trainer's format.
"""

import dataclasses
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    TrainerControl,
    TrainerState,
    TrainingArguments,
    get_scheduler,
)
from transformers.trainer_utils import TrainOutput

from posttrain.entrypoints.rewards import completion_text


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


# ---------------------------------------------------------------- the maths


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Generalised advantage estimates over response tokens (``[batch, time]``).

    ``mask`` marks real tokens; padding comes only after them, has reward and
    value 0, so the value after the last real token is 0.

    >>> gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.25]]), torch.ones(1, 2), 1.0, 1.0)
    tensor([[0.5000, 0.7500]])
    """
    rewards, values = rewards * mask, values * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        next_value = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
    return advantages * mask


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def policy_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, cliprange: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate ``max(-A ρ, -A clip(ρ, 1-ε, 1+ε))`` and the clipped fraction."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    return masked_mean(torch.max(unclipped, clipped), mask), masked_mean((clipped > unclipped).float(), mask)


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, cliprange_value: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``½ max((V - R)², (clip(V, V_old ± ε) - R)²)`` and the clipped fraction."""
    clipped_values = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    unclipped_error, clipped_error = (values - returns) ** 2, (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(unclipped_error, clipped_error), mask)
    return loss, masked_mean((clipped_error > unclipped_error).float(), mask)


def kl_per_token(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Schulman's k1 (``logp - logp_ref``) or k3 (``(q - 1) - log q``, ``q = p_ref / p``)."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    return torch.expm1(-log_ratio) + log_ratio


def adapted_kl_coef(kl_coef: float, kl: float, target: float, samples: int, horizon: int) -> float:
    """Ziegler et al.'s controller: ``β (1 + clip(KL/target - 1, ±0.2) n / horizon)``."""
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return kl_coef * (1.0 + error * samples / horizon)


# ---------------------------------------------------------------- models


class PolicyAndValue(nn.Module):
    """One module for the policy and the value model, so one DDP wrapper and optimizer serve both."""

    def __init__(self, policy: PreTrainedModel, value_model: PreTrainedModel) -> None:
        super().__init__()
        self.policy = policy
        self.value_model = value_model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        position_ids = positions(attention_mask)
        logits = self.policy(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        return logits, token_values(self.value_model, input_ids, attention_mask, position_ids)


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip left padding, as ``generate`` computes them."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def token_values(
    value_model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor:
    """A sequence-classification model's score head applied at every position: ``[batch, time]``."""
    backbone = getattr(value_model, value_model.base_model_prefix)
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
    return value_model.score(hidden).squeeze(-1).float()


def response_logprobs(logits: torch.Tensor, tokens: torch.Tensor, prompt_length: int, temperature: float) -> Tuple[
    torch.Tensor, torch.Tensor
]:
    """Log-probabilities of the response tokens at the sampling temperature, and the entropy."""
    response_logits = logits[:, prompt_length - 1 : -1].float() / temperature
    log_probs = F.log_softmax(response_logits, dim=-1)
    chosen = torch.gather(log_probs, 2, tokens[:, prompt_length:].unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return chosen, entropy


# ---------------------------------------------------------------- the trainer


class PPOTrainer:
    """PPO with a policy, a frozen reference, a value model and rewards; HF Trainer's outputs.

    It offers what the runtime uses of a Trainer: ``train``, ``save_model``,
    ``save_state``, ``state``, ``accelerator``, ``is_world_process_zero``.
    """

    def __init__(
        self,
        policy: PreTrainedModel,
        ref_policy: PreTrainedModel,
        value_model: PreTrainedModel,
        rewards: Sequence[Any],
        reward_weights: Sequence[float],
        args: PPOConfig,
        train_dataset: Any,
        processing_class: Any,
        callbacks: Sequence[Any] = (),
    ) -> None:
        self.args = args
        self.tokenizer = processing_class
        self.accelerator = Accelerator(cpu=args.use_cpu, mixed_precision=_mixed_precision(args))
        self.device = self.accelerator.device
        self.callbacks = list(callbacks)
        self.state = TrainerState(is_local_process_zero=self.accelerator.is_local_main_process,
                                  is_world_process_zero=self.accelerator.is_main_process)  # fmt: skip
        self.control = TrainerControl()
        self.kl_coef = args.kl_coef
        self.dataset = train_dataset
        self.prompts = [self._encode_prompt(row["prompt"]) for row in train_dataset]
        self.reward_weights = torch.tensor(list(reward_weights), dtype=torch.float32)
        self.reward_functions = [self._load_reward(reward) for reward in rewards]

        for model in (policy, value_model):
            model.config.use_cache = False
        self.ref_policy = ref_policy.to(self.device).eval().requires_grad_(False)
        model = PolicyAndValue(policy, value_model)
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=args.learning_rate,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon,
            weight_decay=args.weight_decay,
        )
        updates = args.max_steps * args.num_ppo_epochs * args.num_mini_batches
        scheduler = get_scheduler(
            args.lr_scheduler_type, optimizer, num_warmup_steps=args.get_warmup_steps(updates),
            num_training_steps=updates,
        )  # fmt: skip
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(model, optimizer, scheduler)

    # ------------------------------------------------------------ inputs

    def _encode_prompt(self, prompt: Any) -> List[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        else:
            ids = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=True)["input_ids"]
        limit = self.args.max_prompt_length
        return list(ids[-limit:]) if limit else list(ids)

    def _load_reward(self, reward: Any) -> Any:
        if callable(reward):
            return reward
        model = AutoModelForSequenceClassification.from_pretrained(reward, num_labels=1)
        tokenizer = AutoTokenizer.from_pretrained(reward)
        tokenizer.padding_side = "right"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = tokenizer.pad_token_id
        return model.to(self.device).eval().requires_grad_(False), tokenizer

    def _batch_indices(self, iteration: int) -> List[int]:
        """This rank's prompts for an iteration: a seeded shuffle per pass over the data."""
        per_rank, world = self.args.per_device_train_batch_size, self.accelerator.num_processes
        per_iteration = per_rank * world
        iterations_per_pass = max(1, len(self.prompts) // per_iteration)
        data_pass, slot = divmod(iteration, iterations_per_pass)
        generator = torch.Generator().manual_seed(self.args.seed * 100_003 + data_pass)
        order = torch.randperm(len(self.prompts), generator=generator).tolist()
        start = slot * per_iteration + self.accelerator.process_index * per_rank
        return order[start : start + per_rank]

    # ------------------------------------------------------------ rollout

    @torch.no_grad()
    def _rollout(self, iteration: int) -> Dict[str, Any]:
        args, pad_id, eos_id = self.args, self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        indices = self._batch_indices(iteration)
        prompt_ids = [self.prompts[i] for i in indices]
        prompt_length = max(len(ids) for ids in prompt_ids)
        prompts = torch.full((len(indices), prompt_length), pad_id, dtype=torch.long)
        prompt_mask = torch.zeros_like(prompts)
        for row, ids in enumerate(prompt_ids):  # left padding
            prompts[row, prompt_length - len(ids) :] = torch.tensor(ids)
            prompt_mask[row, prompt_length - len(ids) :] = 1
        prompts, prompt_mask = prompts.to(self.device), prompt_mask.to(self.device)

        unwrapped = self.accelerator.unwrap_model(self.model)
        torch.manual_seed(args.seed * 1_000_003 + iteration * 7919 + self.accelerator.process_index)
        unwrapped.policy.eval()
        generated = unwrapped.policy.generate(
            input_ids=prompts,
            attention_mask=prompt_mask,
            max_new_tokens=args.max_completion_length,
            do_sample=True,
            temperature=args.temperature,
            top_k=0,
            top_p=1.0,
            pad_token_id=pad_id,
            eos_token_id=eos_id,
            use_cache=True,
        )
        unwrapped.policy.train()
        responses = generated[:, prompt_length:]
        response_mask = _until_first(responses, eos_id)
        responses = torch.where(response_mask.bool(), responses, torch.full_like(responses, pad_id))
        tokens = torch.cat([prompts, responses], dim=1)
        attention_mask = torch.cat([prompt_mask, response_mask], dim=1)

        logits, values = unwrapped(tokens, attention_mask)
        logprobs, _ = response_logprobs(logits, tokens, prompt_length, args.temperature)
        ref_logits = self.ref_policy(
            input_ids=tokens, attention_mask=attention_mask, position_ids=positions(attention_mask)
        ).logits
        ref_logprobs, _ = response_logprobs(ref_logits, tokens, prompt_length, args.temperature)
        values = values[:, prompt_length - 1 : -1]

        scores = self._score([self.dataset[i] for i in indices], responses, response_mask)
        ends_with_eos = (responses == eos_id).any(dim=1)
        if args.missing_eos_penalty is not None:
            scores = torch.where(ends_with_eos, scores, scores - args.missing_eos_penalty)
        kl = kl_per_token(logprobs, ref_logprobs, args.kl_estimator) * response_mask
        rewards = -self.kl_coef * kl
        last = (response_mask.sum(dim=1) - 1).clamp(min=0)
        rewards[torch.arange(len(indices), device=self.device), last] += scores
        advantages = gae(rewards, values, response_mask.float(), args.gamma, args.lam)
        returns = advantages + values
        advantages = self._whiten(advantages, response_mask.float())
        return {
            "tokens": tokens, "attention_mask": attention_mask, "prompt_length": prompt_length,
            "response_mask": response_mask.float(), "logprobs": logprobs, "values": values,
            "returns": returns, "advantages": advantages, "scores": scores, "kl": kl.sum(dim=1),
            "non_score_reward": (-self.kl_coef * kl).sum(dim=1),
        }  # fmt: skip

    def _score(self, rows: List[Dict[str, Any]], responses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(responses * mask, skip_special_tokens=True)
        prompts = [row["prompt"] for row in rows]
        conversational = not isinstance(prompts[0], str)
        completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
        columns = {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"}
        per_reward = []
        for reward in self.reward_functions:
            if callable(reward):
                scored = reward(prompts=prompts, completions=completions, **columns)
                per_reward.append(torch.tensor([math.nan if s is None else float(s) for s in scored]))
            else:
                per_reward.append(self._model_scores(reward, prompts, completions))
        stacked = torch.stack(per_reward, dim=1)
        return (stacked * self.reward_weights.unsqueeze(0)).nansum(dim=1).to(self.device)

    def _model_scores(self, reward: Tuple[PreTrainedModel, Any], prompts: List[Any], completions: List[Any]) -> torch.Tensor:
        model, tokenizer = reward
        if isinstance(prompts[0], str):
            texts = [p + completion_text(c) for p, c in zip(prompts, completions)]
        else:
            texts = [tokenizer.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions)]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        return model(**encoded).logits[:, 0].float().cpu()

    def _whiten(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Zero mean, unit variance over the real tokens of every rank."""
        stats = torch.stack([(values * mask).sum(), (values**2 * mask).sum(), mask.sum()])
        total, total_sq, count = self.accelerator.reduce(stats, reduction="sum").tolist()
        mean = total / max(count, 1.0)
        variance = max(total_sq / max(count, 1.0) - mean**2, 0.0)
        return (values - mean) / math.sqrt(variance + 1e-8) * mask

    # ------------------------------------------------------------ update

    def _update(self, batch: Dict[str, Any], iteration: int) -> Dict[str, float]:
        args = self.args
        size = batch["tokens"].shape[0]
        if size % args.num_mini_batches:
            raise ValueError(f"per_device_train_batch_size {size} does not divide into {args.num_mini_batches} mini-batches")
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
                    self.accelerator.clip_grad_norm_(self.model.parameters(), args.max_grad_norm)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad()
                approxkl = 0.5 * masked_mean((logprobs - batch["logprobs"][mini]) ** 2, mask)
                for key, value in (
                    ("loss", loss), ("loss/policy", pg_loss), ("loss/value", vf_loss), ("policy/clipfrac", pg_clipfrac),
                    ("val/clipfrac", vf_clipfrac), ("policy/approxkl", approxkl),
                    ("objective/entropy", masked_mean(entropy, mask)),
                ):  # fmt: skip
                    sums[key] = sums.get(key, 0.0) + value.item()
                updates += 1
        return {key: total / updates for key, total in sums.items()}

    # ------------------------------------------------------------ loop

    def train(self, resume_from_checkpoint: Optional[str] = None) -> TrainOutput:
        if resume_from_checkpoint is not None:
            self._load_checkpoint(Path(resume_from_checkpoint))
        args, state = self.args, self.state
        state.max_steps, state.logging_steps, state.save_steps = args.max_steps, args.logging_steps, args.save_steps
        self._callback("on_train_begin")
        start, losses = time.time(), []
        for iteration in range(state.global_step, args.max_steps):
            batch = self._rollout(iteration)
            stats = self._update(batch, iteration)
            losses.append(stats["loss"])
            tokens = (batch["attention_mask"].sum()).reshape(1)
            state.num_input_tokens_seen += int(self.accelerator.reduce(tokens, reduction="sum").item())
            rollout_stats = self._rollout_stats(batch)
            if args.adaptive_kl:
                samples = args.per_device_train_batch_size * self.accelerator.num_processes
                self.kl_coef = adapted_kl_coef(self.kl_coef, rollout_stats["objective/kl"], args.kl_target, samples,
                                               args.kl_horizon)  # fmt: skip
            state.global_step = iteration + 1
            state.epoch = state.global_step * args.per_device_train_batch_size * self.accelerator.num_processes / len(
                self.prompts
            )
            if state.global_step == 1 or state.global_step % args.logging_steps == 0:
                self._log({**rollout_stats, **self._mean_across_ranks(stats)})
            self._callback("on_step_end")
            if self.control.should_save or (args.save_steps and state.global_step % args.save_steps == 0):
                self._save_checkpoint()
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
        local = torch.stack([
            batch["scores"].mean(), batch["kl"].mean(), batch["non_score_reward"].mean(), mask.sum(dim=1).mean(),
        ]).float()  # fmt: skip
        scores, kl, non_score, length = (self.accelerator.reduce(local, reduction="mean")).tolist()
        residual = masked_mean((returns - values) ** 2, mask) / (masked_mean((returns - masked_mean(returns, mask)) ** 2, mask) + 1e-8)
        explained = self.accelerator.reduce((1 - residual).reshape(1), reduction="mean").item()
        return {
            "objective/scores": scores, "objective/kl": kl, "objective/non_score_reward": non_score,
            "objective/kl_coef": self.kl_coef, "response_length": length, "val/explained_variance": explained,
            "learning_rate": self.scheduler.get_last_lr()[0],
        }  # fmt: skip

    def _mean_across_ranks(self, stats: Dict[str, float]) -> Dict[str, float]:
        keys = sorted(stats)
        reduced = self.accelerator.reduce(torch.tensor([stats[k] for k in keys], device=self.device), reduction="mean")
        return dict(zip(keys, reduced.tolist()))

    def _log(self, logs: Dict[str, float]) -> None:
        entry = {**logs, "epoch": self.state.epoch, "step": self.state.global_step}
        self.state.log_history.append(entry)
        if self.accelerator.is_main_process:
            print({k: round(v, 4) if isinstance(v, float) else v for k, v in entry.items()}, flush=True)
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

    def save_state(self) -> None:
        if self.accelerator.is_main_process:
            self.state.save_to_json(str(Path(self.args.output_dir) / "trainer_state.json"))

    def _save_checkpoint(self) -> None:
        directory = Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}"
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            directory.mkdir(parents=True, exist_ok=True)
            torch.save(self.accelerator.unwrap_model(self.model).state_dict(), directory / "ppo_model.pt")
            torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), directory / "scheduler.pt")
            (directory / "ppo_state.json").write_text(json.dumps({"kl_coef": self.kl_coef}))
            self.state.save_to_json(str(directory / "trainer_state.json"))  # last: marks the checkpoint complete
            self._rotate_checkpoints()
        self.accelerator.wait_for_everyone()

    def _rotate_checkpoints(self) -> None:
        limit = self.args.save_total_limit
        if not limit:
            return
        checkpoints = sorted(Path(self.args.output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        for old in checkpoints[:-limit]:
            shutil.rmtree(old, ignore_errors=True)

    def _load_checkpoint(self, directory: Path) -> None:
        state = torch.load(directory / "ppo_model.pt", map_location="cpu", weights_only=True)
        self.accelerator.unwrap_model(self.model).load_state_dict(state)
        self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", map_location="cpu", weights_only=True))
        self.scheduler.load_state_dict(torch.load(directory / "scheduler.pt", map_location="cpu", weights_only=True))
        self.kl_coef = json.loads((directory / "ppo_state.json").read_text())["kl_coef"]
        loaded = TrainerState.load_from_json(str(directory / "trainer_state.json"))
        loaded.is_world_process_zero, loaded.is_local_process_zero = (
            self.state.is_world_process_zero, self.state.is_local_process_zero
        )
        self.state = loaded


def _until_first(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 up to and including the first EOS of each row (all of it where there is none), else 0."""
    is_eos = tokens == eos_id
    after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return (~after_eos).long()


def _mixed_precision(args: TrainingArguments) -> str:
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "no"

