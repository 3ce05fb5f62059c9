"""PPO's experience: prompts drawn for an iteration, responses generated and scored, advantages computed.

Steps 1 to 3 of an iteration of :class:`~posttrain.entrypoints.trainers.ppo_trainer.PPOTrainer`
(rollout, score, advantages); the update consumes what :meth:`Rollouts.collect`
returns. Nothing here changes a weight.
"""

import asyncio
import inspect
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from accelerate import Accelerator
from transformers import PreTrainedModel

from posttrain.entrypoints.generation.sampling import prompt_ids, sampling_from_the_logits
from posttrain.entrypoints.inputs.rewards import reward_model_scores
from posttrain.entrypoints.speed.rl_padding_free import generation_attention
from posttrain.entrypoints.trainers.ppo_math import gae, kl_per_token, response_logprobs, until_first, whiten
from posttrain.entrypoints.trainers.ppo_models import causal_lm_logits


class Rollouts:
    """The prompts, the frozen reference and the rewards; one batch of experience per iteration."""

    def __init__(
        self,
        args: Any,
        tokenizer: Any,
        accelerator: Accelerator,
        dataset: Any,
        ref_policy: PreTrainedModel,
        reward_funcs: Sequence[Any],
        reward_processing_classes: Sequence[Optional[Any]],
        reward_weights: Sequence[float],
    ) -> None:
        self.args, self.tokenizer, self.accelerator, self.dataset = args, tokenizer, accelerator, dataset
        self.device = accelerator.device
        self.prompts = [self._encode_prompt(row["prompt"]) for row in dataset]
        self.reward_weights = torch.tensor(list(reward_weights), dtype=torch.float32)
        # TRL's shape: functions, and loaded reward models with their tokenizers (None beside a function)
        self.reward_functions = [
            reward if tokenizer is None else (reward.to(self.device).eval().requires_grad_(False), tokenizer)
            for reward, tokenizer in zip(reward_funcs, reward_processing_classes)
        ]
        self.ref_policy = ref_policy.to(self.device).eval().requires_grad_(False)

    def _encode_prompt(self, prompt: Any) -> List[int]:
        ids = prompt_ids(self.tokenizer, prompt)
        limit = self.args.max_prompt_length
        return ids[-limit:] if limit else ids

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

    @torch.no_grad()
    def collect(self, model: nn.Module, iteration: int, kl_coef: float) -> Dict[str, Any]:
        """This rank's experience for ``iteration``, from the unwrapped policy-and-value ``model``."""
        args, pad_id, eos_id = self.args, self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        indices = self._batch_indices(iteration)
        prompt_ids = [self.prompts[i] for i in indices]
        prompt_length = max(len(ids) for ids in prompt_ids)
        prompts = torch.full((len(indices), prompt_length), pad_id, dtype=torch.long)
        prompt_mask = torch.zeros_like(prompts)
        # left padding
        for row, ids in enumerate(prompt_ids):
            prompts[row, prompt_length - len(ids) :] = torch.tensor(ids)
            prompt_mask[row, prompt_length - len(ids) :] = 1
        prompts, prompt_mask = prompts.to(self.device), prompt_mask.to(self.device)

        torch.manual_seed(args.seed * 1_000_003 + iteration * 7919 + self.accelerator.process_index)
        with sampling_from_the_logits(model.policy), generation_attention(model.policy):
            generated = model.policy.generate(
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
        responses = generated[:, prompt_length:]
        response_mask = until_first(responses, eos_id)
        responses = torch.where(response_mask.bool(), responses, torch.full_like(responses, pad_id))
        tokens = torch.cat([prompts, responses], dim=1)
        attention_mask = torch.cat([prompt_mask, response_mask], dim=1)

        # in autocast: accelerate wraps the forward
        logits, values = model(tokens, attention_mask)
        logprobs, _ = response_logprobs(logits, tokens, prompt_length, args.temperature)
        # the same precision as the policy's, so KL starts at 0 under bf16
        with self.accelerator.autocast():
            ref_logits = causal_lm_logits(self.ref_policy, tokens, attention_mask, model.padding_free)
        ref_logprobs, _ = response_logprobs(ref_logits, tokens, prompt_length, args.temperature)
        values = values[:, prompt_length - 1 : -1]

        scores = self._score([self.dataset[i] for i in indices], responses, response_mask)
        ends_with_eos = (responses == eos_id).any(dim=1)
        if args.missing_eos_penalty is not None:
            scores = torch.where(ends_with_eos, scores, scores - args.missing_eos_penalty)
        kl = kl_per_token(logprobs, ref_logprobs, args.kl_estimator) * response_mask
        rewards = -kl_coef * kl
        last = (response_mask.sum(dim=1) - 1).clamp(min=0)
        rewards[torch.arange(len(indices), device=self.device), last] += scores
        advantages = gae(rewards, values, response_mask.float(), args.gamma, args.lam)
        returns = advantages + values
        advantages = whiten(advantages, response_mask.float(), lambda t: self.accelerator.reduce(t, reduction="sum"))
        return {
            "tokens": tokens,
            "attention_mask": attention_mask,
            "prompt_length": prompt_length,
            "response_mask": response_mask.float(),
            "logprobs": logprobs,
            "values": values,
            "returns": returns,
            "advantages": advantages,
            "scores": scores,
            "kl": kl.sum(dim=1),
            "non_score_reward": (-kl_coef * kl).sum(dim=1),
        }

    def _score(self, rows: List[Dict[str, Any]], responses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # each response up to its EOS, never the padding after it (in most tokenizers id 0 is an ordinary token)
        texts = [
            self.tokenizer.decode(response[row_mask.bool()], skip_special_tokens=True)
            for response, row_mask in zip(responses, mask)
        ]
        prompts = [row["prompt"] for row in rows]
        conversational = not isinstance(prompts[0], str)
        completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
        columns = {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"}
        per_reward = []
        for reward in self.reward_functions:
            if callable(reward):
                scored = reward(prompts=prompts, completions=completions, **columns)
                # an async reward (as TRL's trainers take them): awaited here
                if inspect.isawaitable(scored):
                    scored = asyncio.run(scored)
                per_reward.append(torch.tensor([math.nan if s is None else float(s) for s in scored]))
            else:
                per_reward.append(self._model_scores(reward, prompts, completions))
        stacked = torch.stack(per_reward, dim=1)
        return (stacked * self.reward_weights.unsqueeze(0)).nansum(dim=1).to(self.device)

    def _model_scores(
        self, reward: Tuple[PreTrainedModel, Any], prompts: List[Any], completions: List[Any]
    ) -> torch.Tensor:
        with self.accelerator.autocast():
            return reward_model_scores(*reward, prompts, completions)
