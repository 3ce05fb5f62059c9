"""An OpenAI-compatible endpoint inside the job, over posttrain's own generation: what an agent program (an async
function given an ``openai`` client, a verifiers harness) calls the policy through.

Paths, each refused with 401 without ``Authorization: Bearer <key>``:

- ``GET /v1/models``: the one model served (another name is refused with 404);
- ``POST /v1/chat/completions``: ``messages``, ``tools``, ``n``, ``temperature``, ``top_p``, ``max_tokens`` /
  ``max_completion_tokens``, ``stop`` (the tokens kept end with the one that completes the stop string, the text
  before it returned), ``logprobs``, ``return_token_ids`` (``prompt_token_ids`` and each choice's ``token_ids``,
  as vLLM returns them) and ``stream`` (the whole reply in one chunk); and vLLM's extras, as a client sends them
  in its ``extra_body``: ``top_k``, ``min_p``, ``repetition_penalty``, ``chat_template_kwargs`` (given to the chat
  template: ``{"enable_thinking": false}``);
- ``POST /inference/v1/generate``: vLLM's token-in/token-out API, which verifiers' train client speaks
  (``token_ids`` and ``sampling_params`` in, the same sampling keys; each choice's ``token_ids`` and log-probs
  out).

The same paths under ``/episodes/<id>/`` record their calls under that episode (``calls(id)``): an agent's client
gets the episode's base URL. A chat request is rendered with the policy's chat template (the one it trained with)
and the tools' schemas, and the reply's tool calls are read back with TRL's parser, the one training uses. Every
call's exact prompt and completion tokens and their log-probs are recorded: what a trainer trains on is what was
sampled, never the text tokenized again. Requests that arrive together are generated in one batch.
"""

import contextlib
import dataclasses
import http.server
import json
import queue
import re
import secrets
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from trl.chat_template_utils import parse_response

from posttrain.entrypoints.generation.chat_messages import BadRequest, continued, rendered, template_messages
from posttrain.entrypoints.generation.engine import Completion, Engine, Request, end_tokens, transformers_engine
from posttrain.entrypoints.generation.vllm_token import matches

# a request waits this long for others to join its batch (an agent's episodes call side by side)
GATHER_S = 0.05
EPISODE_PATH = re.compile(r"^/episodes/([A-Za-z0-9_.-]{1,128})(/.*)$")
# what the endpoint itself gives the chat template, which a request's chat_template_kwargs may not
RENDERING_KEYS = frozenset(("messages", "tools", "chat_template", "tokenize", "return_dict", "add_generation_prompt"))


@dataclasses.dataclass(frozen=True)
class Call:
    """One completion the endpoint gave: exactly the tokens of its prompt and of what the model wrote."""

    prompt_ids: List[int]
    completion_ids: List[int]
    logprobs: List[float]
    finish_reason: str
    # a chat call's: its messages as rendered, and the reply (None: a call of the token API)
    messages: Optional[List[Dict[str, Any]]] = None
    reply: Optional[Dict[str, Any]] = None


class Endpoint:
    """The endpoint, serving ``model_name`` from ``engine`` while :meth:`serving`; ``template``: the chat template
    to render with (None: the tokenizer's own); ``stop_token_ids``: the model's end tokens, where every
    completion stops (besides a request's own); ``sampling``: the temperature and top-p of a request that gives
    none; ``max_tokens``: the most tokens a completion may have (None: what the model's length leaves);
    ``gather_s``: how long a request waits for others to join its batch. An engine that fails answers each
    request of its batch with its error (a 500), and :meth:`serving` raises its first failure as it ends."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        template: Optional[str],
        model_name: str,
        max_model_len: int,
        stop_token_ids: Sequence[int],
        key: Optional[str] = None,
        sampling: Tuple[float, float] = (1.0, 1.0),
        max_tokens: Optional[int] = None,
        gather_s: float = GATHER_S,
    ) -> None:
        self.engine, self.tokenizer, self.template = engine, tokenizer, template
        self.model_name, self.max_model_len = model_name, max_model_len
        self.stop_token_ids = tuple(stop_token_ids)
        self.sampling, self.max_tokens, self.gather_s = sampling, max_tokens, gather_s
        self.key = key or secrets.token_urlsafe(24)
        self._calls: Dict[str, List[Call]] = {}
        self._lock = threading.Lock()
        # a fast tokenizer used from two threads at once can fail ("Already borrowed"): one request's at a time
        self._tokenizing = threading.Lock()
        self._waiting: "queue.Queue[Optional[Tuple[Request, Future]]]" = queue.Queue()
        self._server: Optional[_Server] = None
        self._closed = threading.Event()
        # the engine's first failure: its callers got it as the server's error, and serving() raises it once done
        self._failure: Optional[Exception] = None

    @contextlib.contextmanager
    def serving(self, host: str = "127.0.0.1", port: int = 0) -> Iterator["Endpoint"]:
        endpoint = self

        class Handler(_Handler):
            served = endpoint

        self._server = _Server((host, port), Handler)
        threads = [threading.Thread(target=self._server.serve_forever, daemon=True)]
        threads.append(threading.Thread(target=self._batches, daemon=True))
        for thread in threads:
            thread.start()
        try:
            yield self
        finally:
            self._closed.set()
            self._server.shutdown()
            self._server.server_close()
            self._waiting.put(None)
            for thread in threads:
                thread.join()
        # an episode scored 0 for its engine's failure is no verdict on the model: the engine's error ends the play
        if self._failure is not None:
            raise self._failure

    def base_url(self, episode: Optional[str] = None) -> str:
        """The OpenAI base URL (``.../v1``), under ``episode``'s path where one is given."""
        assert self._server is not None, "base_url() is known while serving()"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}" + (f"/episodes/{episode}" if episode else "") + "/v1"

    def calls(self, episode: Optional[str] = None) -> List[Call]:
        """The completions given under ``episode``'s path (None: outside any), in the order they were given."""
        with self._lock:
            return list(self._calls.get(episode or "", []))

    def complete(self, requests: Sequence[Request], stops: Sequence[str] = ()) -> List[Completion]:
        """``requests`` generated (together with any others waiting), each cut where its text first holds one of
        ``stops``."""
        if self._closed.is_set():
            raise BadRequest("the endpoint is closing: its job's episodes have ended", 503)
        futures = []
        for request in requests:
            future: Future = Future()
            self._waiting.put((request, future))
            futures.append(future)
        return [self._cut(future.result(), stops) for future in futures]

    def _record(self, episode: str, calls: List[Call]) -> None:
        with self._lock:
            self._calls.setdefault(episode, []).extend(calls)

    def _cut(self, completion: Completion, stops: Sequence[str]) -> Completion:
        """``completion`` up to the token that completes its first stop string, if any: the tokens the caller saw."""
        if stops:
            for end in range(1, len(completion.ids) + 1):
                with self._tokenizing:
                    text = self.tokenizer.decode(completion.ids[:end])
                if any(stop in text for stop in stops):
                    return Completion(completion.ids[:end], completion.logprobs[:end], "stop")
        return completion

    def _batches(self) -> None:
        while True:
            first = self._waiting.get()
            if first is None:
                # what came after the end: failed, not left waiting
                with contextlib.suppress(queue.Empty):
                    while True:
                        late = self._waiting.get_nowait()
                        if late is not None:
                            late[1].set_exception(BadRequest("the endpoint closed before generating it", 503))
                return
            batch, gathered = [first], time.monotonic() + self.gather_s
            with contextlib.suppress(queue.Empty):
                while True:
                    waiting = self._waiting.get(timeout=max(0.0, gathered - time.monotonic()))
                    if waiting is None:
                        self._waiting.put(None)
                        break
                    batch.append(waiting)
            try:
                completions = self.engine([request for request, _ in batch])
            except Exception as error:  # noqa: BLE001 -- each caller answers it as the server's error
                self._failure = self._failure or error
                for _, future in batch:
                    future.set_exception(error)
                continue
            for (_, future), completion in zip(batch, completions, strict=True):
                future.set_result(completion)

    # ------------------------------------------------------------------ the API's requests and replies

    def models(self) -> Dict[str, Any]:
        model = {"id": self.model_name, "object": "model", "owned_by": "posttrain", "max_model_len": self.max_model_len}
        return {"object": "list", "data": [model]}

    def chat(self, body: Dict[str, Any], episode: str) -> Dict[str, Any]:
        self._check_model(body)
        tools = body.get("tools") or None
        given = body.get("messages") or []
        if not isinstance(given, list) or not all(isinstance(message, dict) for message in given):
            raise BadRequest("messages: a list of message objects")
        messages = template_messages(given)
        if not messages:
            raise BadRequest("messages: at least one message")
        options = body.get("chat_template_kwargs") or {}
        if not isinstance(options, dict) or set(options) & RENDERING_KEYS:
            taken = ", ".join(sorted(RENDERING_KEYS))
            raise BadRequest(f"chat_template_kwargs: an object of the template's own variables (not {taken})")
        with self._tokenizing:
            prompt_ids = self._continued(episode, messages, tools, options) or rendered(
                self.tokenizer, self.template, tools, messages, add_generation_prompt=True, **options
            )
        request = self._request(prompt_ids, body, body.get("max_completion_tokens") or body.get("max_tokens"))
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        if not isinstance(stops, list) or not all(isinstance(stop, str) and stop for stop in stops):
            raise BadRequest(f"stop: a string or a list of strings, none empty, not {body.get('stop')!r}")
        completions = self.complete([request] * _count(body), stops)
        choices, calls = [], []
        for index, completion in enumerate(completions):
            message, finish_reason = self._message(completion, list(prompt_ids), tools, stops)
            said = template_messages([message])[0]
            calls.append(Call(list(prompt_ids), completion.ids, completion.logprobs, finish_reason, messages, said))
            choice: Dict[str, Any] = {"index": index, "message": message, "finish_reason": finish_reason}
            if body.get("logprobs"):
                choice["logprobs"] = {"content": self._logprobs(completion)}
            if body.get("return_token_ids"):
                choice["token_ids"] = completion.ids
            choices.append(choice)
        self._record(episode, calls)
        reply = self._reply("chat.completion", choices, prompt_ids, completions)
        if body.get("return_token_ids"):
            reply["prompt_token_ids"] = list(prompt_ids)
        return reply

    def _continued(
        self, episode: str, messages: List[Dict[str, Any]], tools: Optional[List[Any]], options: Dict[str, Any]
    ) -> Optional[List[int]]:
        """An episode's call that goes on with its latest earlier call whose conversation and reply its messages
        start with: that call's tokens, then the new messages' (chat_messages.continued)."""
        for call in reversed(self.calls(episode) if episode else []):
            held = (call.messages or []) + [call.reply or {}]
            if call.messages is not None and len(messages) > len(held) and messages[: len(held)] == held:
                earlier = call.prompt_ids + call.completion_ids
                return continued(
                    self.tokenizer, self.template, tools, held, earlier, self.stop_token_ids, messages, options
                )
        return None

    def generate(self, body: Dict[str, Any], episode: str) -> Dict[str, Any]:
        if body.get("model") is not None:
            self._check_model(body)
        prompt_ids = body.get("token_ids")
        if not isinstance(prompt_ids, list) or not prompt_ids or not all(self._token(t) for t in prompt_ids):
            raise BadRequest(f"token_ids: a list of at least one token id, each below {len(self.tokenizer)}")
        sampling = body.get("sampling_params") or {}
        if not isinstance(sampling, dict):
            raise BadRequest("sampling_params: an object")
        request = self._request(prompt_ids, sampling, sampling.get("max_tokens"))
        completions = self.complete([request] * _count(sampling))
        self._record(episode, [Call(list(prompt_ids), c.ids, c.logprobs, c.finish_reason) for c in completions])
        choices = [
            {
                "index": index,
                "token_ids": completion.ids,
                "logprobs": {"content": self._logprobs(completion)},
                "finish_reason": completion.finish_reason,
            }
            for index, completion in enumerate(completions)
        ]
        reply = self._reply("generate", choices, prompt_ids, completions)
        reply.update(output_mode="tokens", prompt_token_ids=list(prompt_ids))
        return reply

    def _check_model(self, body: Dict[str, Any]) -> None:
        if body.get("model") != self.model_name:
            raise BadRequest(
                f"The model `{body.get('model')}` does not exist: this endpoint serves `{self.model_name}`", 404
            )

    def _request(self, prompt_ids: Sequence[int], sampling: Dict[str, Any], max_tokens: Optional[int]) -> Request:
        room = self.max_model_len - len(prompt_ids)
        if room <= 0:
            raise BadRequest(f"the prompt is {len(prompt_ids)} tokens; the model takes {self.max_model_len} in all")
        if max_tokens is not None and (not _whole(max_tokens) or max_tokens < 1):
            raise BadRequest(f"max_tokens: a whole number of at least 1, not {max_tokens!r}")
        temperature, top_p = sampling.get("temperature"), sampling.get("top_p")
        temperature = self.sampling[0] if temperature is None else temperature
        top_p = self.sampling[1] if top_p is None else top_p
        # what one request gets wrong fails its own call, not the batch it would have joined
        if not _real(temperature) or temperature < 0:
            raise BadRequest(f"temperature: 0 (greedy) or more, not {temperature!r}")
        if not _real(top_p) or not 0 < top_p <= 1:
            raise BadRequest(f"top_p: above 0, at most 1, not {top_p!r}")
        top_k, min_p = sampling.get("top_k"), sampling.get("min_p")
        repetition_penalty = sampling.get("repetition_penalty")
        # vLLM's: -1 (or 0) for no top-k cut
        if top_k is not None and (not _whole(top_k) or top_k < -1):
            raise BadRequest(f"top_k: a whole number, -1 or 0 for none, not {top_k!r}")
        if min_p is not None and (not _real(min_p) or not 0 <= min_p <= 1):
            raise BadRequest(f"min_p: from 0 to 1, not {min_p!r}")
        if repetition_penalty is not None and (not _real(repetition_penalty) or repetition_penalty <= 0):
            raise BadRequest(f"repetition_penalty: above 0 (1 for none), not {repetition_penalty!r}")
        stop_token_ids = sampling.get("stop_token_ids") or []
        if not isinstance(stop_token_ids, list) or not all(self._token(token) for token in stop_token_ids):
            raise BadRequest(f"stop_token_ids: a list of token ids below {len(self.tokenizer)}")
        return Request(
            prompt_ids=tuple(prompt_ids),
            max_tokens=min(max_tokens or room, self.max_tokens or room, room),
            temperature=float(temperature),
            top_p=float(top_p),
            top_k=max(top_k or 0, 0),
            min_p=float(min_p or 0.0),
            repetition_penalty=float(1.0 if repetition_penalty is None else repetition_penalty),
            stop_token_ids=self.stop_token_ids + tuple(stop_token_ids),
        )

    def _token(self, token: Any) -> bool:
        return _whole(token) and 0 <= token < len(self.tokenizer)

    def _message(
        self, completion: Completion, prompt_ids: List[int], tools: Optional[List[Any]], stops: List[str]
    ) -> Tuple[Dict[str, Any], str]:
        with self._tokenizing:
            parsed = parse_response(self.tokenizer, completion.ids, prefix=prompt_ids, tools=tools)
        content = parsed.get("content") or ""
        finish_reason = completion.finish_reason
        # as OpenAI's: the text up to the stop string, which it leaves out
        cut = min((content.find(stop) for stop in stops if stop in content), default=-1)
        if cut >= 0:
            content = content[:cut]
        calls = [
            {
                "id": f"call_{secrets.token_hex(8)}",
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": json.dumps(call["function"]["arguments"])},
            }
            for call in parsed.get("tool_calls") or []
        ]
        message: Dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
        if calls:
            message["tool_calls"] = calls
            finish_reason = "tool_calls"
        return message, finish_reason

    def _logprobs(self, completion: Completion) -> List[Dict[str, Any]]:
        return [
            {"token": f"token_id:{token}", "token_id": token, "logprob": logprob, "top_logprobs": []}
            for token, logprob in zip(completion.ids, completion.logprobs)
        ]

    def _reply(
        self, kind: str, choices: List[Dict[str, Any]], prompt_ids: Sequence[int], completions: List[Completion]
    ) -> Dict[str, Any]:
        written = sum(len(completion.ids) for completion in completions)
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": written}
        usage["total_tokens"] = len(prompt_ids) + written
        return {
            "id": f"{kind}-{secrets.token_hex(12)}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": usage,
        }


def over_model(
    model: Any, tokenizer: Any, template: Optional[str], name: str, sampling: Tuple[float, float], max_tokens: int
) -> Endpoint:
    """An endpoint serving ``model`` as ``name`` from transformers' ``generate``, up to its length, stopping where
    its turn ends."""
    engine, ends = transformers_engine(model, tokenizer), end_tokens(model.generation_config, tokenizer)
    length = model.config.max_position_embeddings
    return Endpoint(engine, tokenizer, template, name, length, ends, None, sampling, max_tokens)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _count(body: Dict[str, Any]) -> int:
    n = body.get("n")
    if n is None:
        return 1
    if not isinstance(n, int) or not 1 <= n <= 64:
        raise BadRequest(f"n: a whole number from 1 to 64, not {n!r}")
    return n


class _Server(http.server.ThreadingHTTPServer):
    # every episode of a process may connect at once: the default backlog of 5 would refuse them
    request_queue_size = 1024
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a caller that went away (an episode past its time) before its reply: nothing to say on the job's console
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    served: Endpoint
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        # the job's console is for the run; an agent's every call would drown it
        pass

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def _answer(self, method: str) -> None:
        scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not matches(given.encode(), self.served.key):
            # its body unread: the connection ends with the answer
            self.close_connection = True
            self._send(401, _error("Unauthorized: this endpoint answers its job's own agents only", 401))
            return
        try:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        except ValueError:
            self.close_connection = True
            self._send(400, _error("Content-Length: a number of bytes", 400))
            return
        found = EPISODE_PATH.match(self.path.split("?", 1)[0])
        episode, path = (found.group(1), found.group(2)) if found else ("", self.path.split("?", 1)[0])
        routes = {
            ("GET", "/v1/models"): lambda _: self.served.models(),
            ("POST", "/v1/chat/completions"): lambda request: self.served.chat(request, episode),
            ("POST", "/inference/v1/generate"): lambda request: self.served.generate(request, episode),
        }
        route = routes.get((method, path.rstrip("/")))
        if route is None:
            self._send(404, _error(f"no {method} {path} here", 404))
            return
        try:
            request = json.loads(body or b"{}")
            if not isinstance(request, dict):
                raise BadRequest("the request's body: a JSON object")
            reply = route(request)
        except json.JSONDecodeError as error:
            self._send(400, _error(f"the request's body is not JSON: {error}", 400))
        except BadRequest as error:
            self._send(error.status, _error(str(error), error.status))
        except Exception as error:  # noqa: BLE001 -- the caller gets the engine's error as the server's
            self._send(500, _error(f"{type(error).__name__}: {error}", 500))
        else:
            if request.get("stream"):
                self._stream(reply, request)
            else:
                self._send(200, reply)

    def _send(self, status: int, reply: Dict[str, Any]) -> None:
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, reply: Dict[str, Any], request: Dict[str, Any]) -> None:
        """A reply as server-sent events, as OpenAI streams it: each choice whole in one chunk, its end in the
        next, the usage last where asked for."""
        kind = "chat.completion.chunk" if reply["object"] == "chat.completion" else reply["object"]
        chunks = []
        for choice in reply["choices"]:
            delta = dict(choice.pop("message", {}))
            for index, call in enumerate(delta.get("tool_calls") or []):
                call["index"] = index
            chunks.append([{**choice, "delta": delta, "finish_reason": None}])
            chunks.append([{"index": choice["index"], "delta": {}, "finish_reason": choice["finish_reason"]}])
        events = [{**reply, "object": kind, "choices": choices, "usage": None} for choices in chunks]
        if (request.get("stream_options") or {}).get("include_usage"):
            events.append({**reply, "object": kind, "choices": []})
        data = b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _error(message: str, status: int) -> Dict[str, Any]:
    kinds = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 500: "InternalServerError"}
    kinds[503] = "ServiceUnavailableError"
    return {"error": {"message": message, "type": kinds.get(status, "Error"), "code": status}}
