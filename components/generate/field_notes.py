"""What each spec field is, in words: the hover text of the JSON Schemas (``schema_json.py``) for fields that have
no docstring of their own (pydantic fields here carry none)."""

from typing import Dict

from posttrain.components.spec.rewards import BUILTIN_REWARDS
from posttrain.components.spec.sections import USER_CODE_TIMEOUT_S

# what an evaluation's fields are, in posttrain.eval's spec and in a training spec's evaluate: section alike
EVALUATION_NOTES: Dict[str, str] = {
    "data": "The held-out prompts: data.eval, one source or a list, rows with a prompt column.",
    "rewards": "The scorers, each reported apart: built-ins, functions or reward models (no weights).",
    "benchmarks": "Tasks of lm-evaluation-harness run on each model (pip install 'posttrain[lm-eval]').",
    "generation": "How each model samples its completions.",
    "pass_at_k": "The k of pass@k: the chance that one of k samples scores 1, from generation.num_samples.",
    "tools": "Functions the model may call in each episode, as in GRPO (default, in a training spec's evaluate: "
    "the spec's own); the prompts must be chat messages.",
    "environment": "What the model acts in, each sample an episode, as in GRPO (default, in a training spec's "
    "evaluate: the spec's own); get_reward() is a scorer named by its class, or by its name among several.",
    "require_min_samples": "The scored samples a scorer's metric needs for a require condition to hold on it "
    "(default 16): on fewer, the condition does not hold and says why.",
    "agent": "An agent written as a program plays each sample's episode (function: module:solve, an async "
    "function of (client, model, row) talking to the model through the job's OpenAI-compatible endpoint); its "
    "reward is a scorer named by the function (docs: Agents).",
}
# Hover text for fields that have no docstring of their own (pydantic fields here carry none).
FIELD_NOTES: Dict[str, Dict[str, str]] = {
    "": {
        "algorithm": "The algorithm this spec is for; must match the component (posttrain.<algorithm>).",
        "resume": "auto (the latest checkpoint in training.output_dir, if any), never, or a checkpoint path.",
        "overwrite_output_dir": "Let the run write over the model training.output_dir holds: another spec's "
        "finished model, weights posttrain did not write, or this spec's finished model (trained again); false "
        "refuses them.",
        "reference_model": "The frozen reference: a path or hub id; default a copy of the policy.",
        "value_model": "The value model: a path or hub id; default the reward model where there is exactly one.",
        "teacher_model": "The teacher: a path or hub id sharing the student's vocabulary.",
        "rewards": "How completions are scored: each a function, a builtin or a reward model, weighted.",
        "tools": "Functions the model may call while it answers (GRPO); their calls and results are part of the "
        "completion. The prompts must be chat messages.",
        "environment": "What the model acts in (GRPO): one environment (factory: module:Class, args), or several "
        "by name, each row's chosen by its environment column. Each rollout gets its own instance: its public "
        "methods are the model's tools, reset(**row) starts it, get_reward() may score it.",
        "agent": "An agent program (module:solve) plays each rollout, calling the model via the job's endpoint (docs: Agents).",
        "model": "The model to train, and how it is loaded.",
        "data": "The training data, optional evaluation data, and column renames.",
        "distributed": "How the job is sharded (DDP by default; DeepSpeed or FSDP) and its collectives' timeout.",
        "evaluate": "Evaluate the trained model in the same job once it is saved, as posttrain.eval would (docs: "
        "Evaluating): into <output_dir>/eval, the results in run_summary.json and the closing line.",
        "generation": "How the trainers and the job's vllm role take turns (training.vllm_mode: server): in "
        "lockstep, or the role generating ahead of training (docs: Generating with vLLM); without vLLM, what "
        "decodes the rollouts.",
    },
    "TrainingGeneration": {
        "max_lag": "How many policy versions (optimizer steps) the samples trained on may lag: the role generates "
        "that far ahead of training (GRPO; on GPUs not yet run here); 0 is lockstep.",
        "weight_sync_steps": "With max_lag above 0: optimizer steps between two pushes of the weights to the role, "
        "at most max_lag + 1.",
        "weight_sync_timeout_s": "How long a push of the weights to the role (in lockstep too), or its silence on "
        "/health while the trainers wait for samples, may last before the job ends in one line.",
        "generate_timeout_s": "How long vLLM's generation of one step's samples (the vllm role's, or a colocated "
        "engine's) may take before the job ends in one line naming it, even while the role answers /health; unset: "
        "9/10 of distributed.timeout_s, how long the other processes wait for the samples.",
        "rollout_generator": "Without vLLM: rollouts decoded by posttrain's rollout generator, where a finished "
        "row leaves the batch (the same sampling and output as transformers' generate; docs: Speed); false: "
        "transformers' generate.",
    },
    "EvalSpec": {
        **EVALUATION_NOTES,
        "algorithm": "eval: posttrain.eval's spec.",
        "output_dir": "Where the results go: eval_summary.json, eval_samples.jsonl, eval.png.",
        "models": "The models to evaluate, by name (lowercase letters, digits and _), the baseline first; each a "
        "model section as in training.",
        "require": "Conditions on the scores (e.g. sft.contains - base.contains >= 0.05): the job fails in one "
        "line where one does not hold.",
        "overwrite_output_dir": "Replace another evaluation's results in output_dir.",
    },
    "EvaluateSection": {
        **EVALUATION_NOTES,
        "require": "Conditions on the scores, on models after and before (e.g. after.contains - before.contains "
        ">= 0.05): the job fails in one line where one does not hold.",
        "before": "Evaluate the model the run started from too, as before (the trained one is after).",
    },
    "BenchmarksSpec": {
        "tasks": "lm-evaluation-harness task or group names (gsm8k, arc_easy, ...; or your own, from include_path).",
        "include_path": "A folder of your own task YAMLs, in the harness's format.",
        "num_fewshot": "Few-shot examples per question; default each task's own.",
        "limit": "Run only each task's first examples.",
        "batch_size": "Requests per forward pass.",
        "apply_chat_template": "Give each question as the user's message in the model's chat template.",
    },
    "EvalData": {
        "train": "Not read: an evaluation reads data.eval.",
        "eval": "The prompts: one source or a list of sources to mix.",
        "columns": "Column renames, found -> expected, in every source.",
        "mix": "How a list of sources becomes one data set: concatenate (in order) or interleave (drawn by weight).",
        "chat": "Make text prompts chat messages: the system message, if any, then the prompt as the user's.",
    },
    "GenerationSpec": {
        "num_samples": "Completions sampled per prompt.",
        "max_new_tokens": "The most tokens a completion may have.",
        "temperature": "Sampling temperature; 0 is greedy (then num_samples 1).",
        "top_p": "Nucleus sampling: sample from the smallest set of tokens whose probability reaches top_p.",
        "seed": "The seed each prompt's own seed is drawn from (with the prompt's place in the data).",
        "engine": "What samples: auto (vLLM where the job's environment has it, else transformers' generate), "
        "transformers or vllm.",
        "vllm_gpu_memory_utilization": "vLLM's share of the device's memory (on CPU, of the machine's).",
        "vllm_timeout_s": "How long vLLM's sampling of one model (a process's prompts or episodes, in a process of its "
        "own) may take before the job ends in one line naming the model.",
        "max_tool_calling_iterations": "With tools or an environment: the rounds of calls and results in an "
        "episode at most (unset: as many as max_new_tokens allows), as GRPO's training.max_tool_calling_iterations.",
    },
    "ModelSpec": {
        "name_or_path": "A local path, a hub id, or builtin:tiny-llama.",
        "dtype": "The dtype the weights are loaded in.",
        "trust_remote_code": "Run the model repository's own code; false unless you say so.",
        "revision": "The hub revision (branch, tag or commit) to load.",
        "attn_implementation": "The attention implementation transformers uses (eager, sdpa, flash_attention_2, ..., "
        "or torch_varlen: torch's varlen kernels, for training); unset, the model's own, or torch_varlen on GPUs "
        "where the algorithm trains on padding-free rows (its reference's default column; docs, Speed).",
        "quantization": "4bit: the trained model's weights load frozen in 4 bits (bitsandbytes' NF4, QLoRA) and "
        "model.lora trains an adapter on them; with data parallelism, on GPUs or CPUs.",
    },
    "DataSpec": {
        "train": "The training data: one source (a local file, a glob of files or a saved data set as path, or a hub "
        "data set as name), or a list of sources to mix.",
        "eval": "Evaluation data, one source or a list, read when training.eval_strategy is steps or epoch.",
        "columns": "Column renames, found -> expected, in every source.",
        "mix": "How a list of sources becomes one data set: concatenate (in order) or interleave (drawn by weight, "
        "seeded by training.seed, until every source is used up).",
        "chat": "Make text prompts chat messages (a chat model's format; tools need it): the system message, if "
        "any, then the prompt as the user's. Prompts that are chat messages already stay as they are.",
    },
    "ChatPrompts": {
        "system": "The system message each prompt opens with; none without it.",
    },
    "DataSource": {
        "path": "A local JSON, JSONL, Parquet or CSV file, a glob of such files (data/*.jsonl), or a directory "
        "save_to_disk wrote; relative to the job's working directory.",
        "name": "A hub data set's id.",
        "reasoning_gym": "Rows reasoning-gym generates (pip install 'posttrain[tasks]'): chat prompts, their answers, "
        "and the answers written as the prompt asks, scored by the built-in reward reasoning_gym (docs: Reasoning "
        "tasks).",
        "verifiers": "The tasks of a verifiers taskset (pip install 'posttrain[verifiers]'), which its environment "
        "plays (environment: {verifiers: ...}); what that environment fills in where the spec gives no data.",
        "config": "The hub data set's configuration (subset).",
        "split": "The split to read: of a hub data set, or of a saved DatasetDict.",
        "columns": "This source's own column renames, found -> expected, beside data.columns.",
        "max_rows": "Keep this source's first max_rows rows only.",
        "weight": "How often an interleaved mixture draws from this source, against the others' weights.",
    },
    "ReasoningTasks": {
        "tasks": "The generators to draw from: each a reasoning-gym task's name, its config and its weight.",
        "size": "How many rows to generate.",
        "seed": "The seed the rows are drawn from: the same rows on every rank and rerun; held-out rows need "
        "another (posttrain refuses one training uses).",
        "system": "The system message each prompt opens with; unset, reasoning-gym's own, which asks for the answer "
        "in <answer></answer> tags.",
        "answer_format": "How a completion writes the answer ({answer} is filled in): what SFT learns and what the "
        "reasoning_gym reward reads back.",
        "wrong_answers": "The share of rows whose completion gives another row's answer (a warm-start for RL that "
        "leaves it something to fix).",
    },
    "ReasoningTask": {
        "name": "A reasoning-gym task (chain_sum, count_bits, ...; reasoning_gym.factory.DATASETS lists them).",
        "config": "The fields of the task's config (e.g. min_terms: 2), as reasoning-gym takes them.",
        "weight": "How often this task is drawn against the source's others.",
    },
    "DeepSpeedSpec": {
        "zero_stage": "ZeRO stage: 1 shards the optimizer state, 2 also the gradients, 3 also the parameters.",
        "offload_optimizer": "Keep the optimizer state in CPU memory (ZeRO-Offload).",
        "offload_params": "Keep the parameters in CPU memory (ZeRO-3 only).",
        "config": "The path of your own DeepSpeed JSON, instead of zero_stage and offload.",
    },
    "FSDPSpec": {
        "reshard_after_forward": "Free each layer's gathered parameters after its forward (less memory); false "
        "keeps them for the backward (fewer all-gathers, like ZeRO-2).",
        "cpu_offload": "Keep the sharded parameters in CPU memory.",
        "wrap_layers": "The layer classes to shard one by one; default the model's decoder layers.",
    },
    "DistributedSpec": {
        "timeout_s": "Process-group timeout in seconds: a hung rank ends the job after this.",
        "deepspeed": "DeepSpeed ZeRO; not with fsdp.",
        "fsdp": "FSDP2 (GPUs only); not with deepspeed.",
    },
    "RewardSource": {
        "function": "module:callable, importable in the job: f(prompts, completions, **columns) -> list[float].",
        "builtin": f"A built-in reward: {', '.join(BUILTIN_REWARDS)}.",
        "model": "A sequence-classification reward model: a path or hub id.",
        "args": "The built-in reward's arguments.",
        "weight": "The reward's weight in the sum.",
        "timeout_s": f"A function's: seconds one call may take (unset: {USER_CODE_TIMEOUT_S:g}); past it the job "
        "ends in one line naming it.",
    },
    "EnvironmentSource": {
        "factory": "module:Class, importable in the job: built with args for each rollout; it needs reset, and its "
        "public methods, each with a docstring describing its typed arguments, are the model's tools.",
        "args": "The keyword arguments the class is built with.",
        "timeout_s": f"Seconds building it, or one call of a method, may take (unset: {USER_CODE_TIMEOUT_S:g}); past "
        "it the job ends in one line naming it.",
    },
    "VerifiersTaskset": {
        "id": "A verifiers taskset's id: an installed package's, or a module the job can import (a module path, "
        "pkg.tasks.mine, is taken too).",
        "args": "The fields of the taskset's config (e.g. num_tasks: 40).",
    },
    "VerifiersEnvironment": {
        "verifiers": "A verifiers taskset's id (verifiers 0.4.0, pip install 'posttrain[verifiers]'): an installed "
        "package's, or a module the job can import. Its tasks are the rows where the spec gives no data; verifiers' "
        "null harness plays each in a process of its own through the job's endpoint; its rewards score the episode "
        "(docs: Agents).",
        "args": "The fields of the taskset's config (e.g. num_tasks: 40).",
        "timeout_s": f"Seconds one episode may take (unset: {USER_CODE_TIMEOUT_S:g}); an episode past it scores 0 "
        "and is counted in episodes.errors.",
    },
    "AgentProgram": {
        "function": "module:function, importable in the job: async def solve(client, model, row) -> reward, or "
        "{'reward': ..., 'metrics': {...}}; client is an openai.AsyncOpenAI pointed at the job's endpoint.",
        "timeout_s": f"Seconds one episode may take (unset: {USER_CODE_TIMEOUT_S:g}); an episode past it scores 0 "
        "and is counted in episodes.errors.",
    },
    "ToolSource": {
        "function": "module:function, importable in the job; its name, typed arguments and docstring (Args:) are "
        "what the model sees of it, and what it returns (as text) is what the model reads back.",
        "timeout_s": f"Seconds one call may take (unset: {USER_CODE_TIMEOUT_S:g}); past it the job ends in one line "
        "naming it.",
    },
}
