"""How models are judged: the prompts, how each model samples, the scores and standard benchmarks; a training
spec's ``evaluate`` section, and the heart of ``posttrain.eval``'s spec (``evaluation.py``)."""

import re
from typing import ClassVar, List, Literal, Optional, Sequence, Tuple, Union

from posttrain.components.spec import conditions
from posttrain.components.spec.messages import cut
from posttrain.components.spec.sections import (
    PROMPT_FORMATS,
    AgentSection,
    DataSource,
    DataSpec,
    RewardSource,
    Strict,
    callable_name,
    taskset_problems,
)


class EvalData(DataSpec):
    """The prompts to evaluate on: ``data.eval`` (one source or a mixture), with the sections' usual renames."""

    train: None = None
    eval: Union[DataSource, List[DataSource]]


class GenerationSpec(Strict):
    """How each model samples: ``num_samples`` completions per prompt of up to ``max_new_tokens``; temperature 0
    is greedy. Only these settings: nothing is taken from a model's own generation config but its end token."""

    num_samples: int = 1
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    # auto: vLLM where the job's environment has it (a process of its own per model), else transformers' generate
    engine: Literal["auto", "transformers", "vllm"] = "auto"
    # vLLM's share of the device's memory (on CPU, of the machine's)
    vllm_gpu_memory_utilization: float = 0.3
    # how long vLLM's sampling of one model (a rank's prompts or episodes, in a process of its own, its engine's
    # start included) may take
    vllm_timeout_s: float = 3600.0
    # with tools or an environment: the rounds of calls and results in an episode at most (None: as many as
    # max_new_tokens allows), as GRPO's training.max_tool_calling_iterations
    max_tool_calling_iterations: Optional[int] = None

    def problems(self) -> List[str]:
        found = []
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            found.append(
                f"generation.vllm_gpu_memory_utilization: expected a share in (0, 1]; got "
                f"{self.vllm_gpu_memory_utilization}"
            )
        if self.vllm_timeout_s <= 0:
            found.append(f"generation.vllm_timeout_s: expected seconds above 0; got {self.vllm_timeout_s:g}")
        if self.num_samples < 1:
            found.append(f"generation.num_samples: expected 1 or more; got {self.num_samples}")
        if self.max_tool_calling_iterations is not None and self.max_tool_calling_iterations < 1:
            found.append(
                "generation.max_tool_calling_iterations: expected 1 or more rounds of calls; got "
                f"{self.max_tool_calling_iterations}"
            )
        if self.max_new_tokens < 1:
            found.append(f"generation.max_new_tokens: expected 1 or more; got {self.max_new_tokens}")
        if self.temperature < 0:
            found.append(f"generation.temperature: expected 0 (greedy) or more; got {self.temperature}")
        if not 0 < self.top_p <= 1:
            found.append(f"generation.top_p: expected a value in (0, 1]; got {self.top_p}")
        elif self.temperature == 0 and self.top_p != 1:
            found.append(f"generation.top_p: {self.top_p} does nothing when greedy (temperature 0); drop it")
        if not 0 <= self.seed < 2**32:
            found.append(f"generation.seed: expected 0 to 2**32 - 1; got {self.seed}")
        if self.temperature == 0 and self.num_samples > 1:
            found.append(
                f"generation.num_samples: {self.num_samples} greedy samples are one sample repeated; set a "
                "temperature above 0, or num_samples: 1"
            )
        return found


class BenchmarksSpec(Strict):
    """Standard benchmarks, run on each model by EleutherAI's lm-evaluation-harness (``pip install
    'posttrain[lm-eval]'``) with the harness's own task definitions, or the user's (``include_path``)."""

    tasks: List[str]
    # a folder of the user's own task YAMLs (a task from a local file)
    include_path: Optional[str] = None
    num_fewshot: Optional[int] = None
    # each task's first examples only
    limit: Optional[int] = None
    batch_size: int = 8
    apply_chat_template: bool = False

    def problems(self) -> List[str]:
        found = [] if self.tasks else ["benchmarks.tasks: name at least one task (e.g. gsm8k, arc_easy)"]
        found += [
            f"benchmarks.tasks.{index}: expected a task name; got {cut(repr(task))}"
            for index, task in enumerate(self.tasks)
            if not re.fullmatch(r"[A-Za-z0-9_][\w.-]*", task)
        ]
        if self.include_path is not None and not self.include_path.strip():
            found.append("benchmarks.include_path: expected a folder of task YAMLs; got an empty string")
        if self.num_fewshot is not None and self.num_fewshot < 0:
            found.append(f"benchmarks.num_fewshot: expected 0 or more; got {self.num_fewshot}")
        if self.limit is not None and self.limit < 1:
            found.append(f"benchmarks.limit: expected 1 or more; got {self.limit}")
        if self.batch_size < 1:
            found.append(f"benchmarks.batch_size: expected 1 or more; got {self.batch_size}")
        return found


class Evaluation(AgentSection):
    """What an evaluation samples and scores: held-out prompts, the scorers (GRPO's rewards vocabulary), how
    each model samples, pass@k's k and the conditions the scores must meet; with ``tools`` or an ``environment``,
    each sample is an episode, as GRPO's rollouts are. ``posttrain.eval``'s spec (evaluation.py) and a training
    spec's ``evaluate:`` section are each one."""

    # held-out prompts the models complete and the scorers score; or only benchmarks, or both
    data: Optional[EvalData] = None
    rewards: List[RewardSource] = []
    benchmarks: Optional[BenchmarksSpec] = None
    generation: GenerationSpec = GenerationSpec()
    # k of pass@k: the chance that at least one of k samples passes (scores 1), from the num_samples drawn
    pass_at_k: List[int] = [1]
    # what the scores must show for the job to succeed (conditions.py)
    require: List[str] = []
    # the scored samples a scorer's metric needs for a condition to hold on it
    require_min_samples: int = conditions.MIN_SAMPLES

    # a prompt column, as GRPO's data
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PROMPT_FORMATS

    def scorer_names(self) -> List[str]:
        """Each scorer's name in the summary: its built-in's or function's name, numbered where two share one;
        then each environment's, whose ``get_reward`` scores its episodes (:meth:`environment_scorers`)."""
        # as require's conditions can write them
        names = [reward.scorer_name() for reward in self.rewards]
        numbered = [f"{name}_{index}" if names.count(name) > 1 else name for index, name in enumerate(names)]
        program = self.program()
        return numbered + self.environment_scorers() + ([program.scorer_name()] if program is not None else [])

    def environment_scorers(self) -> List[str]:
        """The scorer each environment's ``get_reward`` is (where its class has one): named by its class (``Room``
        for ``my_env:Room``), or by its name among several."""
        classes = self.environment_classes()
        if isinstance(classes, dict):
            return list(classes)
        return [callable_name(classes.factory)] if classes else []

    def _program_problems(self, names: List[str]) -> List[str]:
        """An agent program (or a verifiers environment) with rounds of calls to bound, or named as another scorer
        is."""
        program = self.program()
        assert program is not None
        found = []
        if self.generation.max_tool_calling_iterations is not None:
            found.append("generation.max_tool_calling_iterations: an agent program bounds its own rounds; drop it")
        if names.count(program.scorer_name()) > 1:
            found.append(
                f"{program.named_by}: its reward's name in the summary, {program.scorer_name()}, is another scorer's "
                f"too; {program.rename}"
            )
        return found

    def evaluation_problems(self, models: Sequence[str]) -> List[str]:
        """What is wrong with the scorers, the generation settings, pass@k and ``require`` (naming ``models``),
        and the data."""
        found = []
        if self.data is None and self.benchmarks is None:
            found.append(
                "data.eval: give held-out prompts (data.eval) and scorers (rewards), or benchmarks (tasks of "
                "lm-evaluation-harness), or both"
            )
        elif self.data is not None and not self.rewards and self.environment is None and self.agent is None:
            found.append("rewards: name at least one scorer (e.g. - builtin: contains, args: {column: answer})")
        elif self.data is None and self.rewards:
            found.append("data.eval: the scorers (rewards) score completions of held-out prompts; give them there")
        names = self.scorer_names()
        for index, reward in enumerate(self.rewards):
            found += reward.problems(f"rewards.{index}")
            if names.count(names[index]) > 1:
                found.append(
                    f"rewards.{index}: its name in the summary, {names[index]}, is another scorer's too; give the "
                    "function another name"
                )
            if reward.weight != 1.0:
                found.append(f"rewards.{index}.weight: an evaluation reports each scorer apart, unweighted; drop it")
        found += self.generation.problems() + self.agent_problems()
        rounds = self.generation.max_tool_calling_iterations
        if self.program() is not None:
            found += self._program_problems(names)
        found += taskset_problems(self.environment, self.data.sources("eval") if self.data is not None else [])
        if rounds is not None and not self.is_agentic():
            found.append(
                f"generation.max_tool_calling_iterations: {rounds} bounds the rounds of tool calls in an episode, and "
                "the spec gives no tools and no environment; add them, or drop it"
            )
        if self.is_agentic() and self.data is None:
            found.append(
                "data.eval: tools, environments and agents play episodes of held-out prompts; give them (data.eval), "
                "or drop tools, environment and agent"
            )
        if self.is_agentic() and conditions.EPISODES in names:
            found.append(
                f"rewards: a scorer named {conditions.EPISODES} would be read as the episodes' counts; rename it"
            )
        for k in self.pass_at_k:
            if not 1 <= k <= self.generation.num_samples:
                found.append(
                    f"pass_at_k: {k} needs at least {k} samples per prompt; expected 1 to generation.num_samples "
                    f"({self.generation.num_samples})"
                )
        tasks = self.benchmarks.tasks if self.benchmarks is not None else []
        found += [
            f"benchmarks.tasks: {task} is also a scorer's name; a condition could not tell them apart"
            for task in tasks
            if task in names
        ]
        found += self.benchmarks.problems() if self.benchmarks is not None else []
        counted = [conditions.EPISODES] if self.is_agentic() else []
        found += conditions.problems(self.require, models, names, self.pass_at_k, [*tasks, *counted])
        if self.require_min_samples < 1:
            found.append(f"require_min_samples: expected 1 or more scored samples; got {self.require_min_samples}")
        return found + (self.data.problems() if self.data is not None else [])


class EvaluateSection(Evaluation):
    """A training spec's ``evaluate:``: once the model is saved, the same job evaluates it as ``after`` (and with
    ``before: true`` the model it started from as ``before``), as ``posttrain.eval`` would, into
    ``<output_dir>/eval``; the results go into ``run_summary.json`` and the run's closing line."""

    before: bool = False

    def model_names(self) -> List[str]:
        """The evaluated models' names, the baseline first (``require:`` names them)."""
        return ["before", "after"] if self.before else ["after"]

    def problems(self) -> List[str]:
        return [f"evaluate.{problem}" for problem in self.evaluation_problems(self.model_names())]
