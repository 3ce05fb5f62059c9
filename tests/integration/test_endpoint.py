"""The job's OpenAI-compatible endpoint (entrypoints/generation/endpoint.py), called by the real ``openai`` client
and over HTTP: the tiny tools model's real tokenizer and chat template, and the tiny model itself generating in
transformers, batched; a scripted engine where a test needs the model to write a tool call."""

import asyncio
import http.client
import json
from typing import Any, Dict, List, Sequence, Tuple
from urllib.parse import urlsplit

import openai
import pytest
import torch
import transformers

from posttrain.entrypoints.generation.endpoint import Endpoint
from posttrain.entrypoints.generation.engine import Completion, Request, transformers_engine
from posttrain.entrypoints.inputs import tiny

SERVED = "policy"
PEEK = '<tool_call>\n{"name": "peek", "arguments": {"room": 3}}\n</tool_call><|im_end|>'
PEEK_TOOL = {
    "type": "function",
    "function": {
        "name": "peek",
        "description": "The value hidden in a room.",
        "parameters": {"type": "object", "properties": {"room": {"type": "integer"}}, "required": ["room"]},
    },
}


@pytest.fixture(scope="module")
def tokenizer(tools_tokenizer: Any) -> Any:
    return tools_tokenizer


@pytest.fixture(scope="module")
def model(tokenizer: Any) -> Any:
    torch.manual_seed(0)
    return tiny.BUILTINS[tiny.NAME_TOOLS][1](tokenizer, transformers.LlamaForCausalLM).eval()


class Scripted:
    """An engine that writes a call of ``peek`` where no result has come back yet, else what the result said; each
    batch it was given recorded."""

    def __init__(self, tokenizer: Any, peek: str = PEEK) -> None:
        self.tokenizer, self.peek = tokenizer, peek
        self.batches: List[List[Request]] = []

    def __call__(self, requests: Sequence[Request]) -> List[Completion]:
        self.batches.append(list(requests))
        written = []
        for request in requests:
            text = self.tokenizer.decode(request.prompt_ids)
            said = "It is 7.<|im_end|>" if "<tool_response>" in text else self.peek
            ids = self.tokenizer.encode(said, add_special_tokens=False)[: request.max_tokens]
            written.append(Completion(ids, [-0.5] * len(ids), "stop"))
        return written


def endpoint_of(engine: Any, tokenizer: Any) -> Endpoint:
    return Endpoint(engine, tokenizer, None, SERVED, 512, [tokenizer.eos_token_id])


def client_of(endpoint: Endpoint, episode: str = "") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=endpoint.base_url(episode or None), api_key=endpoint.key, max_retries=0)


async def listed(client: openai.AsyncOpenAI) -> Any:
    return await client.models.list()


def raw(endpoint: Endpoint, method: str, path: str, body: Any = None, key: str = "") -> Tuple[int, Dict[str, Any]]:
    address = urlsplit(endpoint.base_url())
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    connection.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def test_a_stranger_without_the_key_gets_401_on_every_path(tokenizer: Any) -> None:
    engine = Scripted(tokenizer)
    chat = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}]}
    generate = {"model": SERVED, "token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 4}}
    paths = [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", chat)]
    paths += [("POST", "/inference/v1/generate", generate), ("GET", "/nowhere", None)]
    paths += [("POST", "/episodes/e1/v1/chat/completions", chat), ("GET", "/episodes/e1/v1/models", None)]
    with endpoint_of(engine, tokenizer).serving() as endpoint:
        for method, path, body in paths:
            for key in ("", "guess", endpoint.key + "x", "Basic " + endpoint.key):
                status, reply = raw(endpoint, method, path, body, key)
                assert status == 401 and reply["error"]["type"] == "AuthenticationError", (path, key)
        # the real client, with a wrong key
        with pytest.raises(openai.AuthenticationError):
            asyncio.run(listed(openai.AsyncOpenAI(base_url=endpoint.base_url(), api_key="guess", max_retries=0)))
        # and with the key: the one model
        models = asyncio.run(listed(client_of(endpoint)))
        assert [model.id for model in models.data] == [SERVED]
    assert engine.batches == [] and endpoint.calls() == []


def test_an_agent_calls_a_tool_through_the_openai_client_and_every_token_is_recorded(tokenizer: Any) -> None:
    engine = Scripted(tokenizer)

    async def agent(client: openai.AsyncOpenAI) -> List[Any]:
        messages: List[Any] = [{"role": "user", "content": "What is in room 3?"}]
        first = await client.chat.completions.create(
            model=SERVED, messages=messages, tools=[PEEK_TOOL], extra_body={"return_token_ids": True}
        )
        call = first.choices[0].message.tool_calls[0]
        messages += [first.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "tool", "tool_call_id": call.id, "content": "7"}]
        second = await client.chat.completions.create(model=SERVED, messages=messages, tools=[PEEK_TOOL], logprobs=True)
        return [first, second]

    with endpoint_of(engine, tokenizer).serving() as endpoint:
        first, second = asyncio.run(agent(client_of(endpoint, "episode-1")))
        calls = endpoint.calls("episode-1")
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == ("peek", {"room": 3})
    assert second.choices[0].message.content == "It is 7." and second.choices[0].finish_reason == "stop"
    # what was recorded is what the engine was given and wrote, and what the reply said it was
    assert len(calls) == 2 and endpoint.calls() == []
    for call_made, batch in zip(calls, engine.batches):
        assert call_made.prompt_ids == list(batch[0].prompt_ids)
    assert calls[0].completion_ids == tokenizer.encode(PEEK, add_special_tokens=False)
    assert first.model_extra["prompt_token_ids"] == calls[0].prompt_ids
    assert first.choices[0].model_extra["token_ids"] == calls[0].completion_ids
    assert [entry.logprob for entry in second.choices[0].logprobs.content] == calls[1].logprobs
    # the second prompt: the first rendered by the chat template, the call (its arguments as the template takes
    # them) and its result after it, as GRPO's rollouts render a conversation
    rendered = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "What is in room 3?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "peek", "arguments": {"room": 3}}}],
            },
            {"role": "tool", "name": "peek", "content": "7"},
        ],
        tools=[PEEK_TOOL],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"]
    assert calls[1].prompt_ids == list(rendered)


def test_a_call_going_on_with_an_episode_keeps_the_model_s_tokens_where_its_text_would_render_otherwise(
    tokenizer: Any,
) -> None:
    """The model writes its call without the template's spaces: rendered again, the conversation would hold other
    tokens than it wrote; the next call's prompt holds the ones it wrote, then the result's, as TRL's tool loop."""
    terse = '<tool_call>\n{"name":"peek","arguments":{"room":3}}\n</tool_call><|im_end|>'
    engine = Scripted(tokenizer, terse)

    async def agent(client: openai.AsyncOpenAI) -> None:
        messages: List[Any] = [{"role": "user", "content": "What is in room 3?"}]
        first = await client.chat.completions.create(model=SERVED, messages=messages, tools=[PEEK_TOOL])
        call = first.choices[0].message.tool_calls[0]
        messages += [first.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "tool", "tool_call_id": call.id, "content": "7"}]
        await client.chat.completions.create(model=SERVED, messages=messages, tools=[PEEK_TOOL])
        # another conversation in the same episode: rendered whole
        await client.chat.completions.create(model=SERVED, messages=messages[:1] + messages[2:], tools=[PEEK_TOOL])

    with endpoint_of(engine, tokenizer).serving() as endpoint:
        asyncio.run(agent(client_of(endpoint, "episode-1")))
        first, second, third = endpoint.calls("episode-1")
    written = tokenizer.encode(terse, add_special_tokens=False)
    assert first.completion_ids == written
    said = first.prompt_ids + written
    assert second.prompt_ids[: len(said)] == said
    assert tokenizer.decode(second.prompt_ids[len(said) :]) == (
        "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    whole = tokenizer.apply_chat_template(
        (second.messages or []), tools=[PEEK_TOOL], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert list(whole) != second.prompt_ids
    assert (
        third.prompt_ids
        == tokenizer.apply_chat_template(
            (third.messages or []), tools=[PEEK_TOOL], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
    )


def test_a_streamed_reply_is_the_whole_reply(tokenizer: Any) -> None:
    async def streamed(client: openai.AsyncOpenAI) -> Tuple[str, List[Any], List[Any]]:
        stream = await client.chat.completions.create(
            model=SERVED,
            messages=[{"role": "user", "content": "What is in room 3?"}],
            tools=[PEEK_TOOL],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        deltas = [choice.delta for chunk in chunks for choice in chunk.choices]
        ends = [choice.finish_reason for chunk in chunks for choice in chunk.choices if choice.finish_reason]
        return (
            "".join(delta.content or "" for delta in deltas),
            [c for d in deltas for c in d.tool_calls or []],
            [
                ends,
                chunks[-1].usage,
            ],
        )

    with endpoint_of(Scripted(tokenizer), tokenizer).serving() as endpoint:
        content, calls, (ends, usage) = asyncio.run(streamed(client_of(endpoint)))
        recorded = endpoint.calls()
    assert content == "" and [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("peek", {"room": 3})
    ]
    assert ends == ["tool_calls"]
    assert usage.completion_tokens == len(recorded[0].completion_ids)
    assert usage.prompt_tokens == len(recorded[0].prompt_ids)


def test_a_stop_string_ends_the_text_and_the_tokens_recorded_where_it_is_complete(tokenizer: Any) -> None:
    # a result already in: the script answers "It is 7."
    answered = [{"role": "user", "content": "What is in room 3?"}, {"role": "tool", "content": "7"}]

    async def chat(client: openai.AsyncOpenAI) -> Any:
        return await client.chat.completions.create(
            model=SERVED, messages=answered, stop=[" 7"], extra_body={"return_token_ids": True}
        )

    with endpoint_of(Scripted(tokenizer), tokenizer).serving() as endpoint:
        reply = asyncio.run(chat(client_of(endpoint)))
        (call,) = endpoint.calls()
    assert reply.choices[0].message.content == "It is" and reply.choices[0].finish_reason == "stop"
    # the tokens up to the one that completes " 7": what the agent saw, and what a trainer trains on
    assert tokenizer.decode(call.completion_ids).endswith(" 7") and " 7" not in tokenizer.decode(
        call.completion_ids[:-1]
    )
    assert reply.choices[0].model_extra["token_ids"] == call.completion_ids and call.finish_reason == "stop"


def test_an_engine_that_fails_answers_its_callers_500_and_ends_the_serving_with_its_error(tokenizer: Any) -> None:
    """An episode that scored 0 because its engine failed says nothing of the model: the play ends with the
    engine's error (vLLM's sampling process past its time, in an evaluation), not with zeros."""

    def failing(requests: Sequence[Request]) -> List[Completion]:
        raise RuntimeError("the engine is gone")

    hi = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(RuntimeError, match="the engine is gone"):
        with endpoint_of(failing, tokenizer).serving() as endpoint:
            status, reply = raw(endpoint, "POST", "/v1/chat/completions", hi, endpoint.key)
            assert (status, reply["error"]["message"]) == (500, "RuntimeError: the engine is gone")


def test_bad_requests_are_refused_in_one_line_each(tokenizer: Any) -> None:
    engine = Scripted(tokenizer)
    hi = [{"role": "user", "content": "hi"}]
    with endpoint_of(engine, tokenizer).serving() as endpoint:
        key = endpoint.key
        refused = [
            (raw(endpoint, "POST", "/v1/chat/completions", {"model": "gpt-4o", "messages": hi}, key), 404),
            (raw(endpoint, "POST", "/v1/chat/completions", {"model": SERVED, "messages": []}, key), 400),
            (raw(endpoint, "POST", "/v1/chat/completions", {"model": SERVED, "messages": hi, "n": 0}, key), 400),
            (
                raw(endpoint, "POST", "/v1/chat/completions", {"model": SERVED, "messages": hi, "max_tokens": -1}, key),
                400,
            ),
            (raw(endpoint, "POST", "/inference/v1/generate", {"token_ids": [1] * 600}, key), 400),
            (raw(endpoint, "POST", "/inference/v1/generate", {"token_ids": "hi"}, key), 400),
            (raw(endpoint, "POST", "/inference/v1/generate", {"token_ids": [len(tokenizer)]}, key), 400),
            (raw(endpoint, "POST", "/inference/v1/generate", {"token_ids": [True]}, key), 400),
            (
                raw(
                    endpoint, "POST", "/v1/chat/completions", {"model": SERVED, "messages": hi, "temperature": -1}, key
                ),
                400,
            ),
            (raw(endpoint, "POST", "/v1/chat/completions", {"model": SERVED, "messages": hi, "top_p": 0}, key), 400),
            (raw(endpoint, "POST", "/v1/chat/completions", {"model": SERVED, "messages": hi, "stop": [""]}, key), 400),
            (raw(endpoint, "POST", "/v1/chat/completions", {"model": SERVED, "messages": ["hi"]}, key), 400),
        ]
        refused += [
            (raw(endpoint, "POST", "/v1/chat/completions", {"model": SERVED, "messages": hi, **extra}, key), 400)
            for extra in (
                {"top_k": -2},
                {"top_k": 1.5},
                {"min_p": 2},
                {"repetition_penalty": 0},
                {"chat_template_kwargs": {"tools": []}},
                {"chat_template_kwargs": "shout"},
            )
        ]
    for (status, reply), expected in refused:
        assert status == expected and "\n" not in reply["error"]["message"], reply
    assert "does not exist: this endpoint serves `policy`" in refused[0][0][1]["error"]["message"]
    assert "the prompt is 600 tokens; the model takes 512 in all" == refused[4][0][1]["error"]["message"]
    assert engine.batches == []


def forward_logprobs(model: Any, prompt: List[int], written: List[int], temperature: float) -> torch.Tensor:
    """The log-probs of ``written`` after ``prompt`` from one forward pass of the whole sequence."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + written])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, torch.tensor(written)[:, None]).squeeze(-1)


def test_episodes_calling_together_are_one_batch_and_each_gets_its_own_tokens_and_logprobs(
    model: Any, tokenizer: Any
) -> None:
    """Four episodes' calls of different lengths, in flight together: transformers generates them in one
    left-padded batch, and each one's log-probs are those a forward pass of its own prompt and tokens gives;
    greedy, a call writes what ``generate`` writes for it alone."""
    batches: List[int] = []
    engine = transformers_engine(model, tokenizer)

    def counted(requests: Sequence[Request]) -> List[Completion]:
        batches.append(len(requests))
        return engine(requests)

    questions = ["hi", "What is in room 3?", "Is the lamp on now, please?", "Open the safe and then tell me."]

    async def episodes(endpoint: Endpoint, temperature: float) -> List[Any]:
        return await asyncio.gather(
            *(
                client_of(endpoint, f"e{index}").chat.completions.create(
                    model=SERVED,
                    messages=[{"role": "user", "content": question}],
                    max_tokens=12,
                    temperature=temperature,
                    extra_body={"return_token_ids": True},
                )
                for index, question in enumerate(questions)
            )
        )

    # a second to gather in: four calls made at once arrive within it on a busy machine too
    endpoint = Endpoint(counted, tokenizer, None, SERVED, 512, [tokenizer.eos_token_id], gather_s=1.0)
    with endpoint.serving():
        sampled = asyncio.run(episodes(endpoint, 0.7))
        sampled_calls = [endpoint.calls(f"e{index}")[0] for index in range(4)]
        greedy = asyncio.run(episodes(endpoint, 0.0))
        greedy_calls = [endpoint.calls(f"e{index}")[1] for index in range(4)]
    assert batches == [4, 4]
    for reply, call in zip(sampled, sampled_calls):
        assert reply.choices[0].model_extra["token_ids"] == call.completion_ids and len(call.completion_ids) > 0
        expected = forward_logprobs(model, call.prompt_ids, call.completion_ids, 0.7)
        torch.testing.assert_close(torch.tensor(call.logprobs), expected, atol=1e-4, rtol=1e-4)
    for reply, call in zip(greedy, greedy_calls):
        assert reply.choices[0].model_extra["token_ids"] == call.completion_ids
        alone = model.generate(
            torch.tensor([call.prompt_ids]), max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )[0, len(call.prompt_ids) :].tolist()
        assert call.completion_ids == alone[: len(call.completion_ids)]
        torch.testing.assert_close(
            torch.tensor(call.logprobs),
            forward_logprobs(model, call.prompt_ids, call.completion_ids, 1.0),
            atol=1e-4,
            rtol=1e-4,
        )


def test_the_token_api_takes_ids_and_gives_ids_and_logprobs(model: Any, tokenizer: Any) -> None:
    """``/inference/v1/generate``, as verifiers' train client calls it: ``n`` completions of the prompt's ids."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    body = {"model": SERVED, "token_ids": prompt, "sampling_params": {"max_tokens": 8, "temperature": 1.0, "n": 3}}
    with endpoint_of(transformers_engine(model, tokenizer), tokenizer).serving() as endpoint:
        status, reply = raw(endpoint, "POST", "/episodes/e7/inference/v1/generate", body, endpoint.key)
        calls = endpoint.calls("e7")
    assert status == 200 and reply["prompt_token_ids"] == prompt and len(reply["choices"]) == 3
    for choice, call in zip(reply["choices"], calls):
        assert choice["token_ids"] == call.completion_ids and call.prompt_ids == prompt
        assert [entry["token_id"] for entry in choice["logprobs"]["content"]] == call.completion_ids
        assert [entry["logprob"] for entry in choice["logprobs"]["content"]] == call.logprobs
        assert choice["finish_reason"] == ("stop" if call.completion_ids[-1] == tokenizer.eos_token_id else "length")


def test_vllm_s_extra_sampling_keys_and_the_template_s_own_variables_are_taken(model: Any, tokenizer: Any) -> None:
    """What a client sends in its extra_body, as vLLM takes it: top_k 1 and min_p 1 sample what greedy writes;
    chat_template_kwargs reach the template (the prompt's tokens, as return_token_ids gives them)."""
    template = "{% if shout %}HEY {% endif %}" + tokenizer.chat_template
    hi = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "return_token_ids": True}
    engine = transformers_engine(model, tokenizer)
    replies = []
    with Endpoint(engine, tokenizer, template, SERVED, 512, [tokenizer.eos_token_id]).serving() as endpoint:
        for extra in (
            {"temperature": 0},
            {"temperature": 1.0, "top_k": 1},
            {"temperature": 1.0, "min_p": 1.0, "repetition_penalty": 1.0},
            {"temperature": 0, "chat_template_kwargs": {"shout": True}},
        ):
            status, reply = raw(endpoint, "POST", "/v1/chat/completions", {**hi, **extra}, endpoint.key)
            assert status == 200, reply
            replies.append(reply)
    greedy, top_1, min_p_1, shouted = replies
    assert top_1["choices"][0]["token_ids"] == min_p_1["choices"][0]["token_ids"] == greedy["choices"][0]["token_ids"]
    assert greedy["prompt_token_ids"] == top_1["prompt_token_ids"]
    assert tokenizer.decode(shouted["prompt_token_ids"]) == "HEY " + tokenizer.decode(greedy["prompt_token_ids"])
