"""vLLM generation for the online trainers (``training.use_vllm``): TRL's own, with what a job needs around it.

TRL 1.16 builds vLLM itself (GRPO and RLOO through
``trl.generation.vllm_generation``, online DPO in its trainer) and pushes the
trained weights into it before each generation. :func:`prepare`, called when
the TRL config is built, checks what cannot work and adapts four things:

- the dtype: TRL passes none, so vLLM would run an fp32 checkpoint in bf16;
  here vLLM runs in the dtype training computes in;
- the built-in tiny models have no directory for vLLM to load: one is
  written to a temporary directory;
- on CPU, vLLM runs eagerly (:func:`runs_eagerly`);
- on CPU, the weight sync: TRL calls ``model.load_weights`` per tensor, but
  vLLM's CPU layers repack their weights after loading (``layer.weight`` is
  then an empty Parameter), so the load fails. TRL's sync runs inside vLLM's
  in-place reload instead (what ``model_runner.reload_weights(...,
  is_checkpoint_format=True)`` does around ``load_weights``: checkpoint
  layout restored first, repacked after), and a tied LM head, which loads
  nothing itself, is repacked from the new embedding. Wrapping TRL's own sync
  keeps its parameter walk (DeepSpeed, FSDP, PEFT names) and serves GRPO,
  RLOO and online DPO alike. On GPUs TRL's path is left as it is.

With ``vllm_mode: server`` the server is the job's ``vllm`` role
(``vllm_server.py``): the trainers take its host from ``POSTTRAIN_VLLM_HOST``,
which the component sets from the scheduler's variables, and send the job's
token with every request (``vllm_token.py``). On GPUs the weights
move over TRL's NCCL path. On CPU (vLLM's transfer engines all need CUDA)
TRL's ``VLLMClient`` writes the tensors TRL hands it, in TRL's names, as one
safetensors file in a directory under ``output_dir`` (which the server must
see) and asks the server's workers to reload from it
(``vllm_server.CheckpointReload``, through vLLM's dev-mode ``/collective_rpc``).

``run_summary.json``'s ``generation`` reads :func:`weight_sync` and what
:func:`_timed_generate` counted on TRL's generator.
"""

import contextlib
import functools
import hmac
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Type

from posttrain.components.spec.generation import VLLM_HOST_VARIABLE, TrainingGeneration
from posttrain.components.spec.messages import SpecError, first_line
from posttrain.components.spec.schema import Spec
from posttrain.components.spec.sections import ModelSpec
from posttrain.entrypoints.generation import role_lease, vllm_token
from posttrain.entrypoints.inputs.models import CAUSAL_LM, ModelLoading, load_model, load_tokenizer
from posttrain.entrypoints.process.distributed import env_rank

# how long the server has to answer the trainers' nonce
PROOF_S = 10.0

# vLLM 0.32's CPU attention (CPUAttentionBackend.get_supported_head_sizes); tests/e2e/test_vllm.py checks it
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

# the directories the weights go to the server through, on CPU, in output_dir
WEIGHTS_PREFIX = ".vllm-weights-"

# what TRL's VLLMGeneration counts, for run_summary.json: completion tokens and seconds in vLLM's generate
TOKENS, SECONDS = "posttrain_completion_tokens", "posttrain_generate_seconds"


def runs_eagerly(on_cpu: bool) -> bool:
    """Whether the vLLM engines posttrain starts (colocated, the ``vllm`` role's server, an evaluation's sampler)
    run without torch.compile: on CPU, where a run with vLLM is a try before GPUs (transformers' generate is as fast
    there or faster: BENCHMARKS.md) and the compile adds 23 s to each engine's start-up for 1.08-1.23x the tokens/s
    ("vLLM on CPU: eager"). On GPUs vLLM's own choice: compiled, with CUDA graphs."""
    return on_cpu


def weight_sync(mode: str, on_cpu: bool) -> str:
    """How the policy's weights reach vLLM (:func:`prepare` set it up): colocated, in place or through vLLM's
    loader; to the server, a safetensors file it reloads (CPU) or TRL's NCCL group."""
    if mode != "server":
        return "inplace_reload" if on_cpu else "load_weights"
    return "safetensors_reload" if on_cpu else "nccl"


def config_problems(algorithm: Type[Spec], training: Mapping[str, Any], on_cpu: bool) -> List[str]:
    """What cannot work with vLLM on this hardware for ``algorithm`` (its spec class), one line each."""
    if not on_cpu:
        return []
    found = []
    if algorithm.vllm_server_needs_gpus and training.get("vllm_mode", "colocate") == "server":
        found.append(
            f"training.vllm_mode: {algorithm.name()}'s server mode needs GPUs (TRL asks torch for an accelerator); "
            "on CPU use colocate"
        )
    if training.get("vllm_enable_sleep_mode"):
        found.append("training.vllm_enable_sleep_mode: vLLM's sleep mode needs GPUs; remove it on CPU")
    return found


def head_size_problem(config: Any, on_cpu: bool) -> Optional[str]:
    """A head size vLLM's CPU attention does not take, said before vLLM fails on it."""
    head_size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if not on_cpu or head_size in CPU_HEAD_SIZES:
        return None
    return (
        f"model.name_or_path: head size {head_size}; vLLM on CPU takes {', '.join(map(str, CPU_HEAD_SIZES))}"
        " (builtin:tiny-llama3-vllm is a tiny model it takes)"
    )


def training_dtype(training: Mapping[str, Any], model: ModelSpec, checkpoint_dtype: Any, on_cpu: bool) -> str:
    """The dtype training computes in: mixed precision's, else the weights' (``auto``: the checkpoint's, fp32 if none).

    ``bf16`` unset is TRL's default on GPUs, bf16 unless fp16 (posttrain turns it off on CPU:
    ``runtime.training_arguments``).

    >>> training_dtype({}, None, None, on_cpu=False)
    'bfloat16'
    """
    bf16 = training.get("bf16")
    if bf16 or (bf16 is None and not on_cpu and not training.get("fp16")):
        return "bfloat16"
    if training.get("fp16"):
        return "float16"
    if model.dtype != "auto":
        return model.dtype
    return str(checkpoint_dtype or "float32").removeprefix("torch.")


def prepare(
    algorithm: Type[Spec],
    model: ModelSpec,
    training: Mapping[str, Any],
    on_cpu: bool,
    generation: Optional[TrainingGeneration] = None,
) -> Dict[str, Any]:
    """Checks the vLLM settings against the hardware, then adapts TRL's vLLM set-up for this job (see above);
    ``generation`` is the spec's (GRPO's and RLOO's): the weight sync's timeout.

    Returns the TRL config's keyword arguments the job sets: the ``vllm`` role's host, if it has one.
    """
    generation = generation or TrainingGeneration()
    problems = config_problems(algorithm, training, on_cpu)
    if problems:
        raise SpecError(problems)
    import importlib

    module_name, class_name, sync_name = algorithm.vllm_owner
    module = importlib.import_module(module_name)
    module.LLM = _llm_factory(_unwrapped(module.LLM), model, training, on_cpu)
    owner = getattr(module, class_name)
    sync = _unwrapped(getattr(owner, sync_name))
    # on GPUs TRL's own
    setattr(owner, sync_name, _cpu_sync(sync) if on_cpu else sync)
    if class_name == "VLLMGeneration":
        owner.generate = _timed_generate(_unwrapped(owner.generate))
    if training.get("vllm_mode", "colocate") != "server":
        return {}
    from trl.generation import vllm_client

    client = vllm_client.VLLMClient
    client.check_server = _role_health_check(_unwrapped(client.check_server))
    if on_cpu:
        output_dir = Path(training["output_dir"])
        if env_rank() == 0:
            # a killed run's (its reload never finished); rank 0 holds output_dir's lease by now
            for folder in output_dir.glob(WEIGHTS_PREFIX + "*"):
                shutil.rmtree(folder, ignore_errors=True)
        _write_and_reload(client, output_dir, generation.weight_sync_timeout_s)
    host = os.environ.get(VLLM_HOST_VARIABLE)
    # an earlier prepare's, in this process
    if isinstance(vars(client).get("session"), TokenSession):
        del client.session
    vllm_client.get_ip = _unwrapped(vllm_client.get_ip)
    # a server the spec names: TRL's client as it is
    if not host:
        return {}
    client.session = TokenSession(vllm_token.required_token("the trainers"))
    vllm_client.get_ip = _toward(host, vllm_client.get_ip)
    return {"vllm_server_host": host}


def shutdown(trainer: Any) -> None:
    """Stops a colocated vLLM engine now, while the process group it joined exists.

    Left to its exit handler, it would leave its groups after the job destroyed
    the default one ("ValueError: Invalid process group specified" at every exit).
    """
    llm = getattr(getattr(trainer, "vllm_generation", None), "llm", None) or getattr(trainer, "llm", None)
    if llm is not None:
        llm.llm_engine.engine_core.shutdown()


def _unwrapped(function: Any) -> Any:
    """What an earlier :func:`prepare` in this process wrapped (tests prepare several jobs)."""
    return getattr(function, "__wrapped__", function)


def _llm_factory(
    llm_class: Callable[..., Any], model: ModelSpec, training: Mapping[str, Any], on_cpu: bool
) -> Callable:
    """vLLM's ``LLM`` as TRL calls it, with a model directory, the training dtype, the CPU head-size check and
    eager on CPU."""

    def make(**kwargs: Any) -> Any:
        from transformers import AutoConfig

        # a built-in model: TRL passes its empty name_or_path
        if not kwargs.get("model"):
            kwargs["model"] = builtin_directory(model)
        config = AutoConfig.from_pretrained(kwargs["model"], trust_remote_code=kwargs.get("trust_remote_code", False))
        problem = head_size_problem(config, on_cpu)
        if problem:
            raise SpecError([problem])
        kwargs.setdefault("dtype", training_dtype(training, model, getattr(config, "dtype", None), on_cpu))
        kwargs.setdefault("enforce_eager", runs_eagerly(on_cpu))
        return llm_class(**kwargs)

    make.__wrapped__ = llm_class  # type: ignore[attr-defined]
    return make


def builtin_directory(model: ModelSpec) -> str:
    """The built-in model and tokenizer, written where vLLM can load them (removed when the process ends).

    Every rank writes its own: ``save_pretrained`` writes on rank 0 only, so the
    config and weights are written directly, tied weights once (as transformers does).
    """
    from safetensors.torch import save_file

    name = model.name_or_path
    if name not in _BUILTIN_DIRECTORIES:
        directory = _BUILTIN_DIRECTORIES[name] = tempfile.TemporaryDirectory(prefix="posttrain-vllm-")
        tokenizer = load_tokenizer(name, model, padding_side="left")
        built = load_model(name, ModelLoading(model), tokenizer, CAUSAL_LM)
        tensors: Dict[str, Any] = {}
        for key, tensor in built.state_dict().items():
            if all(tensor.data_ptr() != kept.data_ptr() for kept in tensors.values()):
                tensors[key] = tensor.contiguous()
        save_file(tensors, f"{directory.name}/model.safetensors", metadata={"format": "pt"})
        built.config.save_pretrained(directory.name)
        tokenizer.save_pretrained(directory.name)
    return _BUILTIN_DIRECTORIES[name].name


_BUILTIN_DIRECTORIES: Dict[str, tempfile.TemporaryDirectory] = {}


def _cpu_sync(sync: Callable[..., Any]) -> Callable[..., Any]:
    """TRL's weight sync, inside vLLM's in-place reload (see the module's docstring)."""

    @functools.wraps(sync)
    def synced(self: Any, *args: Any, **kwargs: Any) -> Any:
        # colocate only; the server mode has none
        llm = getattr(self, "llm", None)
        with _reloading(llm) if llm is not None else contextlib.nullcontext():
            return sync(self, *args, **kwargs)

    return synced


@contextlib.contextmanager
def _reloading(llm: Any) -> Iterator[None]:
    """Loads inside it go through vLLM's in-place reload: checkpoint layout restored first, repacked after."""
    from vllm.model_executor.model_loader.reload.layerwise import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    model = runner.get_model()
    initialize_layerwise_reload(model)
    yield
    finalize_layerwise_reload(model, runner.vllm_config.model_config)
    repack_tied_lm_head(model, runner.vllm_config.model_config)


def repack_tied_lm_head(model: Any, model_config: Any) -> None:
    """A tied head loads nothing in a reload (the embedding brings its weight): its packed CPU copy is redone."""
    lm_head = getattr(model, "lm_head", None)
    if lm_head is not None and getattr(model_config.hf_config, "tie_word_embeddings", False):
        lm_head.quant_method.process_weights_after_loading(lm_head)


def _timed_generate(generate: Callable[..., Any]) -> Callable[..., Any]:
    """TRL's ``VLLMGeneration.generate``, counting the completion tokens and the time."""

    @functools.wraps(generate)
    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = generate(self, *args, **kwargs)
        # (prompt_ids, completion_ids, logprobs, extra)
        count_generated(self, time.perf_counter() - started, result[1])
        return result

    return timed


def count_generated(owner: Any, seconds: float, completion_ids: List[List[int]]) -> None:
    """Adds a generate call's time and completion tokens to what ``owner`` (TRL's generator) counted."""
    setattr(owner, SECONDS, getattr(owner, SECONDS, 0.0) + seconds)
    setattr(owner, TOKENS, getattr(owner, TOKENS, 0) + sum(len(ids) for ids in completion_ids))


def _check_proof(base_url: str) -> None:
    """Stops in one line unless the server at ``base_url`` proves it holds the job's token (vllm_token.PROOF_PATH),
    asked without the token."""
    import requests

    nonce = os.urandom(16).hex()
    token = vllm_token.required_token("the trainers")
    try:
        given = requests.get(f"{base_url}{vllm_token.PROOF_PATH}", params={"nonce": nonce}, timeout=PROOF_S)
        proved = given.status_code == 200 and hmac.compare_digest(
            str(given.json().get("proof", "")).encode(), vllm_token.proof(token, b"server", nonce.encode())
        )
    except (requests.RequestException, ValueError, AttributeError):
        proved = False
    if not proved:
        raise SpecError(
            [
                f"vllm role: the server at {base_url} did not prove it holds the job's token: not this job's vllm "
                "role (another process on its port?); nothing was sent to it"
            ]
        )


def _role_health_check(check_server: Callable[..., Any]) -> Callable[..., Any]:
    """TRL's wait for the server's ``/health``, ending at once if the ``vllm`` role exits; each end is one line."""

    @functools.wraps(check_server)
    def check(self: Any, total_timeout: float = 0.0, *args: Any, **kwargs: Any) -> Any:
        import requests

        role = os.environ.get(VLLM_HOST_VARIABLE)
        where = "the vllm role's server" if role else "the vLLM server"
        deadline = time.monotonic() + total_timeout
        while True:
            try:
                if requests.get(f"{self.base_url}/health", timeout=role_lease.POLL_S).status_code == 200:
                    # before TRL's client sends it the token: the server proves it holds it too
                    if role:
                        _check_proof(self.base_url)
                    return check_server(self, total_timeout, *args, **kwargs)
            except requests.RequestException:
                pass
            if role_lease.role_exited():
                raise SpecError([f"vllm role: {where} exited before it answered at {self.base_url}; see its log"])
            if time.monotonic() > deadline:
                raise SpecError(
                    [
                        f"training.vllm_server_timeout: {where} at {self.base_url} did not answer /health "
                        f"within {total_timeout:.0f} s; see its log, or allow it longer"
                    ]
                )
            time.sleep(role_lease.POLL_S)

    return check


def _toward(host: str, get_ip: Callable[[], str]) -> Callable[[], str]:
    """Where TRL's NCCL rendezvous (torch's TCPStore, which has no authentication) listens on GPUs: this host's
    address toward the role (loopback on local_cwd), not TRL's choice, the address of the default route."""

    @functools.wraps(get_ip)
    def toward() -> str:
        return role_lease.route_address(host)

    return toward


class TokenSession:
    """``VLLMClient.session`` for the job's ``vllm`` role: the session TRL's ``__init__`` makes carries the job's
    token before its first request (``/v1/models``, in ``__init__`` itself), and so does every request after. As
    the session's ``auth``: a header alone would give way to a ``~/.netrc`` entry, which requests applies otherwise."""

    def __init__(self, token: str) -> None:
        self.token = token

    def __get__(self, client: Any, owner: Any = None) -> Any:
        return self if client is None else client.__dict__["session"]

    def __set__(self, client: Any, session: Any) -> None:
        session.auth = self.bearer
        client.__dict__["session"] = session

    def bearer(self, request: Any) -> Any:
        request.headers["Authorization"] = f"Bearer {self.token}"
        return request


def _write_and_reload(client_class: Any, output_dir: Path, timeout_s: float) -> None:
    """On CPU, TRL's ``VLLMClient`` hands the weights over as a safetensors file the server reloads from.

    TRL calls ``update_named_params`` inside ``weight_update()`` (start, tensors, finish) or alone; the
    tensors are copied as they come (ZeRO-3 frees, PEFT unmerges them after) and written at the finish.
    """

    def init_communicator(self: Any, device: Any = 0) -> None:
        # no communicator; this still fails clearly on a server without dev mode
        self.get_server_info()

    def start(self: Any) -> None:
        self._tensors = {}

    def update_named_params(self: Any, metadata: Any, named_params: Iterator[Tuple[str, Any]]) -> None:
        alone = not self._updating_weights
        if alone:
            start(self)
        for name, tensor in named_params:
            self._tensors[name] = tensor.detach().to("cpu", copy=True).contiguous()
        if alone:
            finish(self)

    def finish(self: Any) -> None:
        try:
            reload_weights(self.session.auth, self.base_url, write_weights(self._tensors, output_dir), timeout_s)
        finally:
            self._tensors = {}

    client_class.init_communicator = init_communicator
    client_class._start_weight_update = start
    client_class.update_named_params = update_named_params
    client_class._finish_weight_update = finish


def write_weights(tensors: Mapping[str, Any], output_dir: Path) -> str:
    """``tensors`` as one safetensors file in a new directory under ``output_dir`` (which the server must see)."""
    from safetensors.torch import save_file

    folder = tempfile.mkdtemp(prefix=WEIGHTS_PREFIX, dir=output_dir)
    try:
        save_file(dict(tensors), f"{folder}/model.safetensors", metadata={"format": "pt"})
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def sync_overdue(base_url: str, what: str, timeout_s: float) -> SpecError:
    """The one line of a weight sync the server did not finish in time."""
    return SpecError(
        [
            f"vllm role: the server at {base_url} did not take {what} within {timeout_s:.0f} s "
            "(generation.weight_sync_timeout_s); see its log"
        ]
    )


def reload_weights(auth: Any, base_url: str, folder: str, timeout_s: float) -> None:
    """The server's workers reload the weights from ``folder`` (``vllm_server.CheckpointReload``), which is removed
    after; one ``vllm role:`` line if they fail, or do not answer within ``timeout_s``. Asked once: TRL's session
    would retry a reload that timed out, five times."""
    import requests

    request = {"method": "reload_checkpoint", "kwargs": {"weights_path": folder}}
    try:
        answer = requests.post(f"{base_url}/collective_rpc", json=request, auth=auth, timeout=timeout_s)
        if answer.status_code != 200:
            raise SpecError(
                [
                    f"vllm role: the server at {base_url} could not reload the weights from {folder} (HTTP "
                    f"{answer.status_code}: {first_line(answer.text)}); it reads them from training.output_dir, "
                    "which it must see (shared storage), and its log says more"
                ]
            )
    except requests.Timeout:
        raise sync_overdue(base_url, "the weights", timeout_s) from None
    except requests.RequestException as error:
        raise SpecError(
            [
                f"vllm role: the server at {base_url} did not answer the reload of the weights "
                f"({first_line(error)}); see its log"
            ]
        ) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def server_model(model: ModelSpec, training: Mapping[str, Any]) -> Tuple[str, str]:
    """What the ``vllm`` role serves: the model's directory (the built-in ones written out) and the training dtype."""
    import torch
    from transformers import AutoConfig

    directory = builtin_directory(model) if model.name_or_path.startswith("builtin:") else model.name_or_path
    config = AutoConfig.from_pretrained(directory, trust_remote_code=model.trust_remote_code)
    on_cpu = not torch.cuda.is_available()
    problem = head_size_problem(config, on_cpu)
    if problem:
        raise SpecError([problem])
    return directory, training_dtype(training, model, getattr(config, "dtype", None), on_cpu)
