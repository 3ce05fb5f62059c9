"""What GRPO trains on where an agent program plays its rollouts (generation/agent_rollouts.py), through TRL's own
GRPOTrainer on CPU with the tiny tools model: every sample is exactly the tokens the endpoint returned the program
(``return_token_ids``), an episode of two calls one sequence with only the model's tokens in the loss; an episode
whose calls do not extend each other trains on nothing."""

from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch
from datasets import Dataset
from transformers import LlamaForCausalLM

from posttrain.entrypoints.generation.agent_rollouts import AgentRollouts, NotOneSequence, sample
from posttrain.entrypoints.generation.agents import Program
from posttrain.entrypoints.generation.endpoint import Call
from posttrain.entrypoints.inputs import tiny

# what the endpoint returned each episode's program: per call, its prompt's tokens and the model's
RETURNED: List[List[Tuple[List[int], List[int]]]] = []
# the prompts of the episodes that trained on nothing: their program failed before it called, or rewrote the
# conversation
NOTHING: List[Any] = []


async def talk(client: Any, model: str, row: Dict[str, Any]) -> float:
    """One call, or two where the row asks: the second the conversation so far and a user's turn (the model's
    reply rewritten, where the row asks 3); none, failing, where the row asks none."""
    messages = list(row["prompt"])
    if not row["turns"] or row["turns"] == 3:
        NOTHING.append(list(messages))
    if not row["turns"]:
        raise RuntimeError("the program's own mistake")
    calls = []
    for _ in range(min(row["turns"], 2)):
        reply = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=6, extra_body={"return_token_ids": True}
        )
        calls.append((reply.model_extra["prompt_token_ids"], reply.choices[0].model_extra["token_ids"]))
        said = reply.choices[0].message.model_dump(exclude_none=True)
        if row["turns"] == 3:
            said = {"role": "assistant", "content": "Something else."}
        messages += [said, {"role": "user", "content": "More."}]
    if row["turns"] != 3:
        RETURNED.append(calls)
    return float(len(calls[-1][1]))


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("policy")
    tokenizer = tiny.build_tokenizer_tools()
    torch.manual_seed(0)
    tiny.build_model_tools(tokenizer, LlamaForCausalLM).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_every_sample_trained_is_the_tokens_the_endpoint_returned(policy: str, tmp_path: Path) -> None:
    from trl import GRPOConfig, GRPOTrainer

    rollouts = AgentRollouts(Program(talk, 60), "talk", "policy")
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=16,
        num_generations=4,
        # each call writes 6 tokens at most; an episode of two is longer, and cut here, as TRL's tool loop cuts
        max_completion_length=24,
        max_steps=2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    rows = [{"prompt": [{"role": "user", "content": f"Count to {n}."}], "turns": n} for n in range(4)]
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=rollouts.reward(),
        args=args,
        train_dataset=Dataset.from_list(rows),
        rollout_func=rollouts,
    )
    rollouts.attach(trainer)
    trained: List[Tuple[List[int], List[int], List[int]]] = []
    score = trainer._generate_and_score_completions

    def kept(inputs: List[Dict[str, Any]]) -> Any:
        batch = score(inputs)
        for row in range(len(inputs)):
            prompt = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist()
            written = batch["completion_mask"][row].bool()
            completion = batch["completion_ids"][row][written].tolist()
            trained.append((prompt, completion, batch["tool_mask"][row][written].tolist()))
        return batch

    trainer._generate_and_score_completions = kept
    RETURNED.clear()
    NOTHING.clear()
    trainer.train()

    tokenizer = trainer.processing_class
    expected, cut = [], 0
    for calls in RETURNED:
        (first_prompt, first), rest = calls[0], calls[1:]
        completion, mask = list(first), [1] * len(first)
        for prompt, written in rest:
            between = prompt[len(first_prompt) + len(completion) :]
            assert prompt[: len(first_prompt) + len(completion)] == first_prompt + completion
            # the user's turn; before it, the template's end of the model's turn where the model did not end it
            ended = completion[-1] == tokenizer.eos_token_id
            assert (
                tokenizer.decode(between)
                == "<|im_end|>" * (not ended) + "\n<|im_start|>user\nMore.<|im_end|>\n<|im_start|>assistant\n"
            )
            completion += between + written
            mask += [0] * len(between) + [1] * len(written)
        expected.append((first_prompt, completion[:24], mask[:24]))
        cut += len(completion) > 24
    # an episode that failed before it called, or rewrote its conversation: its prompt, and one end token the loss
    # does not count
    for prompt in NOTHING:
        rendered = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=True)["input_ids"]
        expected.append((list(rendered), [tokenizer.eos_token_id], [0]))
    assert len(trained) == 32 and sorted(trained) == sorted(expected)
    # every kind of episode was trained: two calls, the user's turn between them masked out; one call; none
    assert {len(calls) for calls in RETURNED} == {1, 2} and len(NOTHING) == 16 and cut > 0
    logged = [record for record in trainer.state.log_history if "agent/errors" in record]
    assert [(record["agent/errors"], record["agent/untrainable"]) for record in logged] == [(0.25, 0.25)] * 2


def test_an_episode_is_one_sequence_only_where_each_call_extends_the_one_before() -> None:
    first = Call([1, 2, 3], [4, 5], [-0.1, -0.2], "stop")
    made = sample([first, Call([1, 2, 3, 4, 5, 9], [6], [-0.3], "stop")])
    assert (made.prompt_ids, made.completion_ids, made.env_mask) == ([1, 2, 3], [4, 5, 9, 6], [1, 1, 0, 1])
    assert made.logprobs == [-0.1, -0.2, 0.0, -0.3]
    with pytest.raises(NotOneSequence) as error:
        sample([first, Call([1, 2, 3, 4, 8, 9], [6], [-0.3], "stop")])
    assert str(error.value).startswith("its call 2 does not extend its call 1")
