"""The spec's sections every algorithm shares: the model, the data, the user's code it runs (rewards, tools,
environments) and the distribution."""

import re
from typing import Any, ClassVar, Dict, List, Literal, Mapping, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict

from posttrain.components.spec.data_sources import data_problems
from posttrain.components.spec.messages import cut
from posttrain.components.spec.rewards import check_builtin

# the data formats of algorithms that read prompts alone (GRPO's, an evaluation's): the model writes the rest
PROMPT_FORMATS: Tuple[Tuple[str, ...], ...] = (("prompt",),)


class Strict(BaseModel):
    """A spec section: unknown keys, values of another type and NaN refused; frozen once read."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class ModelSpec(Strict):
    """The model to train: a local path, a hub id, or ``builtin:tiny-llama``."""

    name_or_path: str
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    attn_implementation: Optional[str] = None
    trust_remote_code: bool = False
    revision: Optional[str] = None
    lora: Optional[Dict[str, Any]] = None
    # the trained model's frozen weights in 4 bits as they load (QLoRA), its LoRA adapter in 16 or 32
    quantization: Optional[Literal["4bit"]] = None


class ReasoningTask(Strict):
    """One of reasoning-gym's generators: its name, its config (the fields of the task's ``*Config``), and its weight
    where a source draws from several."""

    name: str
    config: Dict[str, Any] = {}
    weight: float = 1.0


class ReasoningTasks(Strict):
    """Rows reasoning-gym generates (``entrypoints/inputs/reasoning_tasks.py``): ``size`` of them from ``seed``, the
    same on every rank and every rerun; each a chat prompt (``system``, then the task's question), its ``answer``,
    and as ``completion`` that answer as ``answer_format`` writes it (another row's, in a share ``wrong_answers``
    of the rows: what SFT warm-starts on, and RL fixes)."""

    tasks: List[ReasoningTask]
    size: int
    seed: int
    # None: reasoning-gym's own (SYSTEM_PROMPTS["default"]), which asks for <answer>...</answer>
    system: Optional[str] = None
    answer_format: str = "<answer>{answer}</answer>"
    wrong_answers: float = 0.0


class VerifiersTaskset(Strict):
    """A verifiers taskset (``verifiers.v1``, verifiers 0.4.0): its id as verifiers resolves one (an installed
    package, or a module the job can import, e.g. from its working directory) and the fields of its config."""

    id: str
    args: Dict[str, Any] = {}


class DataSource(Strict):
    """One data source: a local file, a glob of files or a saved data set (``path``), a hub data set (``name``),
    reasoning-gym's generators (``reasoning_gym``), or the tasks of a verifiers taskset (``verifiers``, what a
    verifiers environment plays where the spec gives no data); its own column renames (beside ``data.columns``), a
    cap on its rows, and its weight in an interleaved mixture."""

    path: Optional[str] = None
    name: Optional[str] = None
    reasoning_gym: Optional[ReasoningTasks] = None
    verifiers: Optional[VerifiersTaskset] = None
    config: Optional[str] = None
    split: str = "train"
    columns: Dict[str, str] = {}
    max_rows: Optional[int] = None
    weight: Optional[float] = None


class ChatPrompts(Strict):
    """Text prompts as chat messages: the system message, if any, then the prompt as the user's."""

    system: Optional[str] = None


class DataSpec(Strict):
    """Training and evaluation data, each one source or a list of them (a mixture: ``mix``); ``columns`` renames
    ``{found: expected}`` in every source; ``chat`` makes text prompts chat messages."""

    train: Union[DataSource, List[DataSource]]
    eval: Union[DataSource, List[DataSource], None] = None
    columns: Dict[str, str] = {}
    mix: Literal["concatenate", "interleave"] = "concatenate"
    chat: Optional[ChatPrompts] = None

    def sources(self, split: str) -> List[Tuple[str, DataSource]]:
        """``data.train`` or ``data.eval`` as ``(dotted key, source)`` pairs: ``data.train``, or ``data.train.0``,
        ``data.train.1``, ... for a list."""
        given = getattr(self, split)
        if given is None:
            return []
        if isinstance(given, DataSource):
            return [(f"data.{split}", given)]
        return [(f"data.{split}.{index}", source) for index, source in enumerate(given)]

    def problems(self) -> List[str]:
        return data_problems(self)


# how long one call of the user's code (a reward function, a tool, an environment's method) may take where the spec
# sets no timeout_s: past it the job ends in one line naming the function (entrypoints/inputs/user_code.py)
USER_CODE_TIMEOUT_S = 600.0


def timeout_problems(where: str, timeout_s: Optional[float]) -> List[str]:
    """A user function's ``timeout_s``: seconds above 0, or unset (:data:`USER_CODE_TIMEOUT_S`)."""
    if timeout_s is None or timeout_s > 0:
        return []
    return [f"{where}.timeout_s: expected seconds above 0 (unset: {USER_CODE_TIMEOUT_S:g}); got {timeout_s:g}"]


def callable_name(path: str) -> str:
    """The own name of the callable at ``module:name`` (``correct`` for ``my_scores:Judge.correct``)."""
    return path.rpartition(":")[2].rpartition(".")[2]


class RewardSource(Strict):
    """One reward: exactly one of a user callable, a built-in, or a reward model; weighted."""

    # "module:callable", importable in the job
    function: Optional[str] = None
    builtin: Optional[str] = None
    # a sequence-classification model: path or hub id
    model: Optional[str] = None
    args: Dict[str, Any] = {}
    weight: float = 1.0
    # how long one call of the function may take (None: USER_CODE_TIMEOUT_S)
    timeout_s: Optional[float] = None

    def scorer_name(self) -> str:
        """Its name in a summary or a log: its built-in's, its function's own (``correct`` for
        ``my_scores:Judge.correct``), or its reward model's folder's (``reward_tiny`` for ``outputs/reward-tiny``)."""
        if self.builtin:
            return self.builtin
        if self.function:
            return callable_name(self.function)
        return re.sub(r"\W", "_", str(self.model).rstrip("/").rpartition("/")[2])

    def problems(self, where: str) -> List[str]:
        given = [key for key in ("function", "builtin", "model") if getattr(self, key) is not None]
        if len(given) != 1:
            return [f"{where}: give exactly one of function (module:callable), builtin (a name) or model (a path)"]
        if self.model is not None and not self.model.strip():
            return [f"{where}.model: expected a path or hub id of a reward model; got an empty string"]
        if self.function is not None:
            problem = import_path_problem(
                f"{where}.function", self.function, "module:callable (e.g. my_rewards:accuracy)"
            )
            if problem is not None:
                return [problem]
        if self.timeout_s is not None and self.function is None:
            what = (
                "a built-in bounds its own work (code_tests: args.timeout_s)" if self.builtin else "a model's does not"
            )
            return [f"{where}.timeout_s: bounds a function's call, and {what}; drop it"]
        if self.builtin is not None:
            return [f"{where}.builtin: {problem}" for problem in check_builtin(self.builtin, self.args)]
        if self.args:
            return [f"{where}.args: only built-in rewards take args"]
        return timeout_problems(where, self.timeout_s)


def import_path_problem(where: str, path: str, expected: str) -> Optional[str]:
    """What is wrong with ``path`` as the import path of user code the job imports ("module:attr"), if anything."""
    if re.fullmatch(r"[\w.]+:[\w.]+", path):
        return None
    return f"{where}: expected {expected}; got {cut(repr(path))}"


class ToolSource(Strict):
    """One tool the model may call while it generates: a user function, whose name, typed arguments and docstring
    are what the model sees of it."""

    # "module:function", importable in the job
    function: str
    # how long one call may take (None: USER_CODE_TIMEOUT_S)
    timeout_s: Optional[float] = None

    def problems(self, where: str) -> List[str]:
        problem = import_path_problem(f"{where}.function", self.function, "module:function (e.g. my_tools:lookup)")
        return ([problem] if problem is not None else []) + timeout_problems(where, self.timeout_s)


class EnvironmentSource(Strict):
    """An environment the model acts in: a class built for each rollout (with ``args``), whose public methods are
    the model's tools, whose ``reset(**row)`` starts it (and may add to the prompt), and whose ``get_reward()`` may
    score the rollout."""

    # "module:Class", importable in the job
    factory: str
    args: Dict[str, Any] = {}
    # how long building it, or one call of a method, may take (None: USER_CODE_TIMEOUT_S)
    timeout_s: Optional[float] = None

    def problems(self, where: str) -> List[str]:
        problem = import_path_problem(f"{where}.factory", self.factory, "module:Class (e.g. my_env:Game)")
        return ([problem] if problem is not None else []) + timeout_problems(where, self.timeout_s)


# the most episodes of an agent program a process plays at once: their calls make the endpoint's batches
EPISODES_AT_ONCE = 64
# past the episodes' own timeouts, before a process's episodes that have not ended end the job
PLAY_GRACE_S = 30.0


def play_bound(timeout_s: float, episodes: int) -> float:
    """How long a process's ``episodes`` of an agent program may take in all, :data:`EPISODES_AT_ONCE` at a time,
    before the job ends: past each one's ``timeout_s`` (which a program blocking its event loop stops),
    :data:`PLAY_GRACE_S`."""
    return -(-episodes // EPISODES_AT_ONCE) * timeout_s + PLAY_GRACE_S


class AgentProgram(Strict):
    """An agent written as a program that talks to the model through an OpenAI-compatible endpoint: ``async def
    solve(client, model, row)``, called once per episode with an ``openai.AsyncOpenAI`` pointed at the job's
    endpoint, the model's name to pass, and the row; it returns the episode's reward, or ``{"reward": ...,
    "metrics": {...}}`` (docs: Agents)."""

    # "module:function", an async function importable in the job
    function: str
    # how long one episode may take (None: USER_CODE_TIMEOUT_S); an episode past it scores 0
    timeout_s: Optional[float] = None

    # its section, the key that names its reward, and how to name it otherwise
    key: ClassVar[str] = "agent"
    named_by: ClassVar[str] = "agent.function"
    rename: ClassVar[str] = "give the function another name"

    def problems(self, where: str) -> List[str]:
        problem = import_path_problem(f"{where}.function", self.function, "module:function (e.g. my_agent:solve)")
        return ([problem] if problem is not None else []) + timeout_problems(where, self.timeout_s)

    def scorer_name(self) -> str:
        """Its reward's name in a summary: the function's (``solve`` for ``my_agent:solve``)."""
        return callable_name(self.function)


class VerifiersEnvironment(Strict):
    """A verifiers environment (verifiers 0.4.0's ``verifiers.v1``): its taskset's tasks, played by verifiers' null
    harness in a local process per episode (the tools of the taskset's toolsets served to it), the model called
    through the job's endpoint, each episode scored by the taskset's rewards (docs: Agents). It plays like an agent
    program: ``timeout_s`` bounds an episode."""

    # the taskset's id, as verifiers resolves one
    verifiers: str
    # the fields of the taskset's config
    args: Dict[str, Any] = {}
    # how long one episode may take (None: USER_CODE_TIMEOUT_S); an episode past it scores 0
    timeout_s: Optional[float] = None

    key: ClassVar[str] = "environment"
    named_by: ClassVar[str] = "environment.verifiers"
    rename: ClassVar[str] = "give the other scorer's function another name"

    def taskset(self) -> VerifiersTaskset:
        return VerifiersTaskset(id=self.verifiers, args=self.args)

    def problems(self, where: str) -> List[str]:
        found = [] if self.verifiers.strip() else [f"{where}.verifiers: expected a taskset's id; got an empty string"]
        return found + timeout_problems(where, self.timeout_s)

    def scorer_name(self) -> str:
        """Its reward's name in a summary: its taskset's module's (``hidden_value`` for
        ``my_tasks.hidden_value``; a hub id ``owner/name@1.0`` is ``name``)."""
        module = self.verifiers.rpartition("/")[2].partition("@")[0].rpartition(".")[2]
        return re.sub(r"\W", "_", module.replace("-", "_").lower())


# what plays an episode through the job's endpoint
EpisodeProgram = Union[AgentProgram, VerifiersEnvironment]


def with_taskset_rows(raw: Mapping[str, Any], split: str) -> Mapping[str, Any]:
    """A spec as written, with its verifiers environment's taskset as ``data.<split>`` where it gives no data: the
    environment plays the taskset's own tasks."""
    environment = raw.get("environment")
    if "data" in raw or not isinstance(environment, dict) or not isinstance(environment.get("verifiers"), str):
        return raw
    args = environment.get("args", {})
    # args of another kind are the environment's own problem, said once there
    taskset = {"id": environment["verifiers"], "args": args if isinstance(args, dict) else {}}
    return {**raw, "data": {split: {"verifiers": taskset}}}


def taskset_problems(environment: Any, sources: List[Tuple[str, DataSource]]) -> List[str]:
    """Rows of a verifiers taskset where no verifiers ``environment`` plays them, and other rows where one does."""
    found = []
    for where, source in sources:
        if isinstance(environment, VerifiersEnvironment) and source.verifiers not in (None, environment.taskset()):
            found.append(
                f"{where}.verifiers: the tasks of {source.verifiers.id} with args {source.verifiers.args}, and the "
                f"environment plays those of {environment.verifiers} with args {environment.args}; a row is played "
                "as its environment's task of its index: give the same id and args, or drop data"
            )
        elif source.verifiers is not None and not isinstance(environment, VerifiersEnvironment):
            found.append(
                f"{where}.verifiers: a taskset's tasks are played by its environment; give environment: "
                f"{{verifiers: {source.verifiers.id}}} (with posttrain.grpo or posttrain.eval)"
            )
        elif source.verifiers is None and isinstance(environment, VerifiersEnvironment):
            found.append(
                f"{where}: a verifiers environment plays its taskset's tasks, not rows of a file; drop data (the "
                f"taskset's tasks are the rows), or give {where}: {{verifiers: {{id: ..., args: {{...}}}}}}"
            )
    return found


class AgentSection(Strict):
    """What plays a sample's episode, as GRPO trains it and an evaluation judges it: the model calling ``tools``,
    or acting in one ``environment`` for every row or several by name (each row's ``environment`` column names its
    own); or an ``agent`` program calling the model."""

    tools: List[ToolSource] = []
    environment: Union[EnvironmentSource, VerifiersEnvironment, Dict[str, EnvironmentSource], None] = None
    # an agent written as a program plays each episode (its own tools, if any), scored by its reward
    agent: Optional[AgentProgram] = None

    def is_agentic(self) -> bool:
        return bool(self.tools) or self.environment is not None or self.agent is not None

    def program(self) -> Optional[EpisodeProgram]:
        """What plays each episode through the job's endpoint: the agent program, or the verifiers environment."""
        if isinstance(self.environment, VerifiersEnvironment):
            return self.environment
        return self.agent

    def environment_classes(self) -> Union[EnvironmentSource, Dict[str, EnvironmentSource], None]:
        """The environment classes the model acts in (TRL's ``environment_factory``): ``environment``, unless it
        is a verifiers environment."""
        return None if isinstance(self.environment, VerifiersEnvironment) else self.environment

    def agent_problems(self) -> List[str]:
        found = []
        if self.agent is not None:
            found += self.agent.problems("agent")
            if self.tools or self.environment is not None:
                found.append(
                    "agent: an agent program makes its own calls through the endpoint; give tools and environment, "
                    "or agent, not both"
                )
        if isinstance(self.environment, VerifiersEnvironment):
            found += self.environment.problems("environment")
            if self.tools:
                found.append("tools: a verifiers environment serves its taskset's own tools; drop tools")
            return found
        for index, tool in enumerate(self.tools):
            found += tool.problems(f"tools.{index}")
        environments = self.environment if isinstance(self.environment, dict) else {"": self.environment}
        for name, environment in environments.items():
            if environment is not None:
                found += environment.problems(f"environment.{name}" if name else "environment")
        if isinstance(self.environment, dict) and not self.environment:
            found.append("environment: name at least one environment, or give one (factory: module:Class)")
        return found


class DeepSpeedSpec(Strict):
    """DeepSpeed ZeRO: a stage with optional CPU offload, or the path of your own DeepSpeed JSON."""

    zero_stage: Optional[Literal[1, 2, 3]] = None
    offload_optimizer: bool = False
    offload_params: bool = False
    config: Optional[str] = None

    def problems(self) -> List[str]:
        found = []
        if (self.config is None) == (self.zero_stage is None):
            found.append(
                "distributed.deepspeed: give zero_stage (1, 2 or 3, with optional offload) or config "
                "(the path of a DeepSpeed JSON), not both or neither"
            )
        if self.config is not None and (self.offload_optimizer or self.offload_params):
            found.append("distributed.deepspeed: offload is set in your config file, not beside config")
        if self.offload_params and self.zero_stage != 3:
            found.append("distributed.deepspeed.offload_params: parameter offload needs zero_stage 3")
        return found

    def training_problems(self, training: Dict[str, Any]) -> List[str]:
        if self.zero_stage == 3 and training.get("auto_find_batch_size") is True:
            return [
                "training.auto_find_batch_size: transformers does not support it with ZeRO-3; remove it, "
                "or use zero_stage 1 or 2"
            ]
        return []

    def gpu_problems(self, no_gpu: str) -> List[str]:
        # DeepSpeed shards on CPU too
        return []


class FSDPSpec(Strict):
    """FSDP2 through accelerate: every decoder layer sharded on its own, then the rest of the model.

    ``reshard_after_forward`` false keeps each layer's gathered parameters
    from the forward to the backward pass (more memory, fewer all-gathers,
    like ZeRO-2). ``wrap_layers`` names the layer classes to shard one by
    one; the default is the model's own (``_no_split_modules``: its decoder
    layers).
    """

    reshard_after_forward: bool = True
    cpu_offload: bool = False
    wrap_layers: Optional[List[str]] = None

    def problems(self) -> List[str]:
        if self.wrap_layers is not None and not self.wrap_layers:
            return ["distributed.fsdp.wrap_layers: an empty list shards nothing; remove it to wrap the decoder layers"]
        return []

    def training_problems(self, training: Dict[str, Any]) -> List[str]:
        if training.get("save_only_model") is True and training.get("load_best_model_at_end") is not True:
            return [
                "training.save_only_model: distributed.fsdp saves sharded checkpoints, the optimizer's state "
                "with the model's; remove it"
            ]
        return []

    def gpu_problems(self, no_gpu: str) -> List[str]:
        """Where the job has no GPU (``no_gpu`` says how it is known): accelerate would train plain DDP instead."""
        return [
            f"distributed.fsdp: {no_gpu}, and accelerate runs FSDP on GPUs only (on CPU it trains plain DDP "
            "instead); run on GPUs, or shard on CPU with distributed.deepspeed"
        ]


# Each sharding section says what its strategy refuses, of the hardware and of ``training``: the client asks it at
# submit, the job's strategy (entrypoints/job/sharding.py) before it starts
class DistributedSpec(Strict):
    """How the job is distributed; ``timeout_s`` bounds every collective (every backend)."""

    timeout_s: int = 300
    deepspeed: Optional[DeepSpeedSpec] = None
    fsdp: Optional[FSDPSpec] = None

    @property
    def sharding(self) -> Optional[Union[DeepSpeedSpec, FSDPSpec]]:
        """The sharding section, or None for plain data parallelism."""
        return self.deepspeed or self.fsdp

    @property
    def strategy(self) -> str:
        """The strategy's name, as ``run_summary.json``'s engine says it (one process: ``single``, not ``ddp``)."""
        return "deepspeed" if self.deepspeed else "fsdp" if self.fsdp else "ddp"

    def problems(self) -> List[str]:
        found = []
        if self.timeout_s <= 0:
            found.append(f"distributed.timeout_s: must be positive; got {self.timeout_s}")
        if self.deepspeed is not None and self.fsdp is not None:
            found.append("distributed: deepspeed and fsdp both shard the model; choose one of them")
        for section in (self.deepspeed, self.fsdp):
            found += section.problems() if section is not None else []
        return found

    def training_problems(self, training: Dict[str, Any]) -> List[str]:
        """What the strategy refuses of ``training``."""
        if self.sharding is None:
            return []
        found = []
        if training.get("save_only_model") is True and training.get("load_best_model_at_end") is True:
            found.append(
                f"training.save_only_model: with distributed.{self.strategy} the best model cannot be "
                "loaded at the end from checkpoints without their sharded state; drop it or "
                "load_best_model_at_end"
            )
        return found + self.sharding.training_problems(training)

    def gpu_problems(self, no_gpu: str) -> List[str]:
        """What the strategy refuses where the job has no GPU; ``no_gpu`` says how that is known."""
        return self.sharding.gpu_problems(no_gpu) if self.sharding is not None else []
