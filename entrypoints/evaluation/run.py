"""An evaluation in a job: each model samples completions of the held-out prompts, the scorers score them, and
rank 0 writes what the scores say (scores.py). ``posttrain.eval``'s job runs one (entrypoints/eval.py), and so
does a training job whose spec has an ``evaluate:`` section, once its model is saved (:func:`evaluate_run`).

The processes share the prompts (prompt i goes to rank i mod world size);
each finished prompt is a line in ``eval_parts/``, so a rerun after a kill
samples only the prompts left, on any number of processes. Then
``eval_samples.jsonl``, ``eval.png`` (two models or more) and, last, the
mark of a finished evaluation, ``eval_summary.json``.
"""

import contextlib
import dataclasses
import functools
import json
import logging
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from posttrain.components.spec import conditions
from posttrain.components.spec.messages import SpecError
from posttrain.entrypoints.evaluation import benchmarks, episodes, programs, results, sampling, scores, scoring, trust
from posttrain.entrypoints.evaluation.files import PARTS_DIR, PLOT_FILE, SAMPLES_FILE, SUMMARY_FILE
from posttrain.entrypoints.evaluation.parts import EvalParts
from posttrain.entrypoints.evaluation.sampling import (
    prompt_seed,
    sample,
    sample_with_vllm,
    vllm_endpoint_engine,
    vllm_turns,
)
from posttrain.entrypoints.generation import agents
from posttrain.entrypoints.generation.endpoint import Endpoint, over_model
from posttrain.entrypoints.generation.engine import end_tokens
from posttrain.entrypoints.generation.sampling import prompt_ids
from posttrain.entrypoints.inputs.chat_templates import training_template, with_response_schema
from posttrain.entrypoints.inputs.data import load_split
from posttrain.entrypoints.inputs.models import (
    CAUSAL_LM,
    ModelLoading,
    check_model_path,
    generation_config,
    load_model,
    load_tokenizer,
)
from posttrain.entrypoints.inputs.rewards import (
    check_reward_columns,
    resolve_rewards,
)
from posttrain.entrypoints.inputs.tools import (
    check_environment_column,
    check_episode_template,
    check_tool_data,
    resolve_environment,
    resolve_tools,
)
from posttrain.entrypoints.process import distributed, lease
from posttrain.entrypoints.records import curves
from posttrain.entrypoints.records.checkpoints import read_record
from posttrain.entrypoints.records.files import replacing, write_json_atomic
from posttrain.entrypoints.records.fingerprints import model_fingerprints, split_fingerprint
from posttrain.entrypoints.records.summary import SUMMARY_FILE as RUN_SUMMARY_FILE
from posttrain.entrypoints.records.summary import say_closing

log = logging.getLogger("posttrain")

# the ranks wait this long at most for each other's sampling, or for rank 0's benchmarks (thousands of questions
# per model)
WAIT = timedelta(hours=12)


@dataclasses.dataclass
class Evaluated:
    """Rank 0's outcome of an evaluation: its summary (``eval_summary.json``) and the line that says it."""

    summary: Dict[str, Any]
    line: str


@dataclasses.dataclass
class Inputs:
    """What an evaluation's checks produce, before any model loads."""

    # the held-out prompts (none for benchmarks alone)
    prompts: Any
    # each scorer by its name: a function, or a reward model's path
    scorers: Dict[str, Any]
    # what samples: transformers or vllm
    engine: str
    # rank 0's index of the benchmarks' tasks, or None
    tasks: Any
    # what each sample may call, where it is an episode; None: a completion
    agent: Optional[episodes.Agent] = None
    # the agent program that plays each episode instead
    program: Optional[agents.Program] = None


def check(evaluation: EvalParts, made_later: Sequence[str] = ()) -> Inputs:
    """Everything an evaluation can check before a model loads, cheapest first, on every rank; no collective call
    and nothing written. ``made_later``: models not made yet (a training run's own, checked once saved)."""
    prompts: Any = []
    if evaluation.data is not None:
        prompts = load_split(evaluation.data, evaluation.data_formats, "eval", evaluation.generation.seed)
        check_reward_columns(evaluation.rewards, False, [("data.eval", prompts)])
    scorers = dict(zip(evaluation.scorer_names, resolve_rewards(evaluation.rewards)))
    agent, program = None, None
    if evaluation.tools or evaluation.environment is not None:
        agent = _agent(evaluation, prompts)
        scorers.update(_environment_scorers(evaluation, agent))
    if evaluation.agent is not None:
        program = agents.resolve(evaluation.agent)
        scorers[evaluation.agent.scorer_name()] = scoring.program_scorer()
    engine = sampling.engine(evaluation.generation)
    for where, name_or_path in evaluation.named_models:
        if name_or_path not in made_later:
            check_model_path(name_or_path, where)
    if agent is not None or program is not None:
        # the chat template renders calls and TRL reads them back: known from the tokenizer, before a model loads
        for model_spec in evaluation.models.values():
            if model_spec.name_or_path not in made_later:
                tokenizer = load_tokenizer(model_spec.name_or_path, model_spec, "left")
                check_episode_template(tokenizer, model_spec.name_or_path, "agent" if program else "tools")
    # rank 0 runs the benchmarks: the harness's index of tasks is its alone (and takes seconds)
    tasks = benchmarks.task_manager(evaluation.benchmarks) if evaluation.benchmarks and distributed.is_rank0() else None
    return Inputs(prompts, scorers, engine, tasks, agent, program)


def _agent(evaluation: EvalParts, prompts: Any) -> episodes.Agent:
    """The spec's tools and environments, imported and checked as GRPO's are (inputs/tools.py), and the prompts
    checked for them."""
    tools = resolve_tools(evaluation.tools)
    environments = resolve_environment(evaluation.environment, scored=bool(evaluation.rewards))
    check_tool_data([("data.eval", prompts)])
    if isinstance(environments, dict):
        check_environment_column(environments, [("data.eval", prompts)])
    return episodes.Agent(tools, environments)


def _environment_scorers(evaluation: EvalParts, agent: episodes.Agent) -> Dict[str, Any]:
    """Each environment whose class has ``get_reward``, as a scorer by its name (``EvalSpec.environment_scorers``)."""
    factories = agent.environments if isinstance(agent.environments, dict) else {None: agent.environments}
    names = evaluation.scorer_names[len(evaluation.rewards) :]
    return {
        name: scoring.environment_scorer(key)
        for name, (key, factory) in zip(names, factories.items())
        if factory is not None and hasattr(factory(), "get_reward")
    }


def evaluate(evaluation: EvalParts, checked: Optional[Inputs] = None) -> Optional[Evaluated]:
    """Runs the evaluation, or finds it finished (its conditions judged again), on every rank of the process
    group; rank 0's outcome (None on the others). ``require:``'s verdicts are in the summary:
    :func:`check_required` fails the job on them. ``checked``: what :func:`check` gave already (a training job
    checks its evaluation before training)."""
    output_dir = evaluation.output_dir
    world, rank = distributed.world_size(), distributed.env_rank()
    # every rank makes it: where the ranks wait for each other's sampling, or for rank 0's benchmarks, longer than
    # a training job's timeout allows
    waiting = distributed.waiting_group(WAIT)
    # rank 0 holds output_dir until the job ends: another run into it stops at its first check
    with contextlib.ExitStack() as held:
        with distributed.all_ranks_agree():
            if distributed.is_rank0():
                held.callback(lease.acquire(output_dir, "output_dir").release)
            inputs = checked if checked is not None else check(evaluation)
            prompts, scorers, engine = inputs.prompts, inputs.scorers, inputs.engine
            record = {
                # what the results depend on: not where they are written, nor whether they may replace others
                "spec": evaluation.results_spec,
                "models": model_fingerprints(evaluation.named_models, None),
                "data": split_fingerprint(evaluation.data, "eval", prompts) if evaluation.data is not None else None,
                "benchmark_tasks": benchmarks.tasks_fingerprint(evaluation.benchmarks)
                if evaluation.benchmarks
                else None,
                # what sampled: its samples are its own
                "engine": engine,
            }
            scorers_code = trust.scorer_fingerprints(evaluation.rewards)
            if not evaluation.is_agentic:
                # what decides the scores of the samples (trust.py): new scorers re-score what was sampled
                record["scorers"] = scorers_code
            else:
                record["agent"] = {
                    **trust.agent_fingerprints(evaluation.tools, evaluation.environment, evaluation.agent),
                    "scorers": scorers_code,
                }
            finished, rescore = results.finished(output_dir, record, evaluation.overwrite)
        # nodes that do not share output_dir would not agree; check_shared_output says so below
        finished, rescore = distributed.rank0s((finished, rescore))
        if finished is not None:
            if not distributed.is_rank0():
                return None
            said = finished.removeprefix("posttrain: ")
            summary = _judge_again(evaluation, output_dir)
            return Evaluated(summary, f"posttrain: {output_dir} holds this evaluation, finished: {said}")
        if distributed.is_rank0():
            if rescore:
                results.rescore(output_dir, record, prompts, scorers)
            results.start(output_dir, record)
        # the others wait for rank 0's re-scoring (reward models, sandboxes) longer than the job's timeout allows
        if rescore:
            _wait(waiting)
        distributed.barrier()
        distributed.check_shared_output(output_dir, "output_dir")

        models = list(evaluation.models)
        if evaluation.data is not None:
            scorers = {name: scoring.scorer(resolved) for name, resolved in scorers.items()}
            done = results.done(output_dir / PARTS_DIR)
            mine = [index for index in range(len(prompts)) if index % world == rank]
            log.info("evaluating %d model(s) on %d prompts, %d process(es)", len(models), len(prompts), world)
            with results.part(output_dir / PARTS_DIR / f"rank-{rank}.jsonl") as part:
                for name in models:
                    left = [index for index in mine if (name, index) not in done]
                    if left:
                        _evaluate_model(evaluation, name, inputs, left, scorers, part)
        _wait(waiting)
        if evaluation.benchmarks is not None:
            # rank 0 runs each model's tasks while the others wait
            if distributed.is_rank0():
                _run_benchmarks(evaluation, output_dir, inputs.tasks)
            _wait(waiting)
        if not distributed.is_rank0():
            return None
        summary = _summarise(evaluation, output_dir, len(prompts), list(scorers), world, engine)
        return Evaluated(summary, summary["closing_line"])


def _wait(group: Any) -> None:
    """Every rank: a barrier of ``group`` (distributed.waiting_group), where there is one."""
    if group is not None:
        dist.barrier(group=group)


def check_required(evaluated: Optional[Evaluated]) -> None:
    """Every rank: the job fails, in one line per condition, where rank 0's evaluation found a ``require:``
    condition that does not hold, so that every node ends (a chain's next stage starts on none)."""
    failed = _failures(evaluated.summary["require"]) if evaluated is not None else None
    failed = distributed.rank0s(failed)
    if failed:
        raise SpecError(failed)


def evaluate_run(
    evaluation: EvalParts, run_dir: Path, run_line: Optional[str], checked: Optional[Inputs] = None
) -> None:
    """A training spec's ``evaluate:`` (evaluation.of_training_run), once the run's model is saved (``run_line``:
    its closing line; ``checked``: its inputs, checked before training) or found finished (None): the evaluation,
    its summary put into the run's ``run_summary.json``, one closing line for both, and the job failed where a
    condition does not hold."""
    evaluated = evaluate(evaluation, checked)
    if evaluated is not None:
        path = run_dir / RUN_SUMMARY_FILE
        run = read_record(path, "train the run again (overwrite_output_dir: true)", keys=("algorithm",))
        run["evaluation"] = evaluated.summary
        write_json_atomic(path, run)
        said = evaluated.line.removeprefix("posttrain: ")
        say_closing(f"{run_line}; {said}" if run_line is not None else evaluated.line)
    check_required(evaluated)


def verdicts(evaluation: EvalParts, summary: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Each ``require:`` condition judged on ``summary``."""
    return [
        conditions.Condition.parse(text).verdict(summary, evaluation.require_min_samples) for text in evaluation.require
    ]


def _failures(judged: List[Dict[str, Any]]) -> Optional[List[str]]:
    """One line per condition that does not hold; None where all do."""
    failed = [conditions.failure(verdict) for verdict in judged if not verdict["held"]]
    if not failed and judged:
        log.info("require: all %d condition(s) hold", len(judged))
    return failed or None


def _judge_again(evaluation: EvalParts, output_dir: Path) -> Dict[str, Any]:
    """Rank 0, on finished results: their summary, with this spec's conditions judged and recorded in it (they
    may have changed since)."""
    path = output_dir / SUMMARY_FILE
    summary = read_record(path, trust.REMEDY, keys=("models",))
    trust.check_sealed(summary, output_dir)
    summary["require"] = verdicts(evaluation, summary)
    write_json_atomic(path, summary)
    return summary


def _loaded(evaluation: EvalParts, name: str) -> Tuple[Any, Any]:
    """A model of the evaluation and its tokenizer (padding on the left, to generate), on this rank's GPU where it
    has one."""
    model_spec = evaluation.models[name]
    tokenizer = load_tokenizer(model_spec.name_or_path, model_spec, "left")
    loading = ModelLoading(model_spec, attention=model_spec.attn_implementation)
    model = load_model(model_spec.name_or_path, loading, tokenizer, CAUSAL_LM).eval()
    if torch.cuda.is_available():
        model.to(torch.device("cuda", torch.cuda.current_device()))
    return model, tokenizer


def _run_benchmarks(evaluation: EvalParts, output_dir: Path, manager: Any) -> None:
    """Rank 0: each model's benchmark results not yet in ``eval_parts/`` (a rerun after a kill skips the models
    done), one file per model."""
    assert evaluation.benchmarks is not None
    for name in evaluation.models:
        path = output_dir / PARTS_DIR / f"benchmarks-{name}.json"
        if path.is_file():
            continue
        log.info("benchmarks of %s: %s (lm-evaluation-harness)", name, ", ".join(evaluation.benchmarks.tasks))
        model, tokenizer = _loaded(evaluation, name)
        write_json_atomic(
            path, benchmarks.run(model, tokenizer, evaluation.benchmarks, manager, evaluation.generation.seed)
        )
        del model


def _evaluate_model(
    evaluation: EvalParts,
    name: str,
    inputs: Inputs,
    indices: List[int],
    scorers: Dict[str, Callable[..., Any]],
    part: Any,
) -> None:
    """One model's completions (or episodes) of this rank's ``indices``, scored, each prompt a line of ``part`` once
    done (with vLLM, or an agent program, once all this rank's prompts are played)."""
    generation, prompts, engine, agent = evaluation.generation, inputs.prompts, inputs.engine, inputs.agent
    model_spec = evaluation.models[name]
    seeds = [prompt_seed(generation, index) for index in indices]
    if inputs.program is not None:
        rows = [prompts[index] for index in indices]
        with _program_endpoint(evaluation, name, engine, seeds[0]) as endpoint:
            all_played = programs.play(endpoint, inputs.program, name, rows, generation.num_samples)
        for index, played in zip(indices, all_played):
            texts = [episode.answer() for episode in played]
            results.write(part, scoring.result(name, index, prompts[index], texts, scorers, played))
        return
    if engine == "vllm" and agent is not None:
        tokenizer = with_response_schema(load_tokenizer(model_spec.name_or_path, model_spec, "left"))
        rows = [prompts[index] for index in indices]
        template = training_template(tokenizer)
        engine_of = functools.partial(vllm_turns, model_spec, generation)
        all_played = episodes.play_together(engine_of, tokenizer, template, rows, seeds, agent, generation)
        for index, played in zip(indices, all_played):
            texts = [episode.answer() for episode in played]
            results.write(part, scoring.result(name, index, prompts[index], texts, scorers, played))
        return
    if engine == "vllm":
        tokenizer = load_tokenizer(model_spec.name_or_path, model_spec, "left")
        tokens = [prompt_ids(tokenizer, prompts[index]["prompt"]) for index in indices]
        for index, texts in zip(indices, sample_with_vllm(model_spec, tokens, seeds, generation)):
            results.write(part, scoring.result(name, index, prompts[index], texts, scorers))
        return
    model, tokenizer = _loaded(evaluation, name)
    if agent is not None:
        tokenizer = with_response_schema(tokenizer)
        template = training_template(tokenizer)
        for index, seed in zip(indices, seeds):
            played = episodes.play(model, tokenizer, template, prompts[index], agent, generation, seed)
            texts = [episode.answer() for episode in played]
            results.write(part, scoring.result(name, index, prompts[index], texts, scorers, played))
        return
    for index, seed in zip(indices, seeds):
        texts = sample(model, tokenizer, prompts[index]["prompt"], generation, seed)
        results.write(part, scoring.result(name, index, prompts[index], texts, scorers))


@contextlib.contextmanager
def _program_endpoint(evaluation: EvalParts, name: str, engine: str, seed: int) -> Iterator[Endpoint]:
    """The endpoint an agent program's episodes call, serving model ``name`` from vLLM (in a process of its own:
    ``sampling.vllm_endpoint_engine``) or transformers; its draws from ``seed``."""
    generation, model_spec = evaluation.generation, evaluation.models[name]
    sampled = (generation.temperature, generation.top_p)
    if engine == "vllm":
        tokenizer = with_response_schema(load_tokenizer(model_spec.name_or_path, model_spec, "left"))
        ends = end_tokens(generation_config(model_spec.name_or_path, model_spec), tokenizer)
        with vllm_endpoint_engine(model_spec, generation, seed) as (generate, length):
            template = training_template(tokenizer)
            endpoint = Endpoint(
                generate, tokenizer, template, name, length, ends, None, sampled, generation.max_new_tokens
            )
            with endpoint.serving():
                yield endpoint
        return
    model, tokenizer = _loaded(evaluation, name)
    tokenizer = with_response_schema(tokenizer)
    torch.manual_seed(seed)
    template = training_template(tokenizer)
    with over_model(model, tokenizer, template, name, sampled, generation.max_new_tokens).serving() as endpoint:
        yield endpoint


def _summarise(
    evaluation: EvalParts, output_dir: Path, prompts: int, scorer_list: List[str], world: int, engine: str
) -> Dict[str, Any]:
    """Rank 0, once every rank has finished: the samples in order, the plot, and the summary last."""
    models = list(evaluation.models)
    kept = {(r["model"], r["index"]): r for r in results.parts(output_dir / PARTS_DIR)}
    missing = [(m, i) for m in models for i in range(prompts) if (m, i) not in kept]
    if missing:
        raise RuntimeError(f"eval: {len(missing)} prompt results missing after every rank finished: {missing[:3]}")
    samples = []
    for model in models:
        for index in range(prompts):
            result = kept[(model, index)]
            for number, text in enumerate(result["completions"]):
                samples.append(
                    {
                        "model": model,
                        "index": index,
                        "sample": number,
                        "prompt": result["prompt"],
                        "completion": text,
                        "scores": {scorer: result["scores"][scorer][number] for scorer in scorer_list},
                    }
                )
                if "extra" in result:
                    samples[-1]["extra"] = {column: values[number] for column, values in result["extra"].items()}
                if "episodes" in result:
                    samples[-1]["episode"] = result["episodes"][number]
    with open(output_dir / SAMPLES_FILE, "w") as out:
        out.writelines(json.dumps(sample) + "\n" for sample in samples)
    summary = scores.summarise(samples, models, scorer_list, evaluation.pass_at_k)
    if evaluation.is_agentic:
        summary["episodes"] = scores.episode_counts(samples, models)
    if evaluation.benchmarks is not None:
        summary["benchmarks"] = {
            model: json.loads((output_dir / PARTS_DIR / f"benchmarks-{model}.json").read_text()) for model in models
        }
    tasks = evaluation.benchmarks.tasks if evaluation.benchmarks is not None else []
    line = scores.closing_line(summary, models, scorer_list, prompts if evaluation.data is not None else None, tasks)
    if len(models) > 1 and scorer_list:
        _plot(summary, models, scorer_list, output_dir / PLOT_FILE)
    summary.update(
        prompts=prompts,
        num_samples=evaluation.generation.num_samples,
        generation={**evaluation.generation.model_dump(), "engine": engine, "processes": world},
        closing_line=line,
    )
    trust.sealed(summary, output_dir / SAMPLES_FILE)
    summary["require"] = verdicts(evaluation, summary)
    write_json_atomic(output_dir / SUMMARY_FILE, summary)
    shutil.rmtree(output_dir / PARTS_DIR, ignore_errors=True)
    return summary


def _plot(summary: Dict[str, Any], models: List[str], scorer_list: List[str], path: Path) -> None:
    """Each scorer's mean per model, with its standard error."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(1.5 + 1.2 * len(models) * len(scorer_list), 3.6), layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    width = 0.8 / len(models)
    for offset, model in enumerate(models):
        results = [summary["models"][model][scorer] for scorer in scorer_list]
        ax.bar(
            [i + offset * width for i in range(len(scorer_list))],
            [r.get("mean", 0.0) for r in results],
            width,
            yerr=[r.get("stderr") or 0.0 for r in results],
            capsize=3,
            label=model,
        )
    ax.set_xticks([i + width * (len(models) - 1) / 2 for i in range(len(scorer_list))], scorer_list)
    ax.set_ylabel("mean score (± standard error)")
    ax.legend(fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    # the plotted numbers, readable back as the training curves' are (curves.read_embedded)
    plotted = {model: {scorer: summary["models"][model][scorer] for scorer in scorer_list} for model in models}
    with replacing(path) as staging:
        figure.savefig(staging, format="png", dpi=100, metadata={curves.DATA_KEY: json.dumps(plotted)})
