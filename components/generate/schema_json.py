"""JSON Schemas of the specs, for editors: completion, hover text and errors while writing YAML.

One schema (draft 2020-12) per algorithm, built from what the validator
itself uses: the sections from the algorithm's pydantic spec class
(``registry.SPEC_CLASSES``), ``training`` and ``model.lora`` from the field
table (``config_fields.json``), so neither TRL nor PEFT is imported::

    python -m posttrain.components.generate.schema_json sft      # prints sft's schema
    python -m posttrain.components.generate.schema_json --all    # rewrites components/generated/schemas/*.schema.json

The files ship in the package; a test fails when they drift from the code.
The templates point the YAML language server at them with their first line::

    # yaml-language-server: $schema=../../components/generated/schemas/sft.schema.json

The schema checks what fields alone can say (keys, types, choices, the value
ranges, text forms and mapping keys of ``value_rules/``, ``training.output_dir``
required); rules across fields (``bf16`` with ``fp16``, the generation batch,
one reward source, values that do nothing with others) are still the validator's.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Type

from posttrain.components.spec.chain import ALGORITHM
from posttrain.components.spec.evaluation import EvalSpec
from posttrain.components.spec.fields import LORA_CONFIG, TABLE_PATH, FieldType, config_fields
from posttrain.components.spec.loading import BOOLEAN_WORDS, EXPONENT_NUMBER
from posttrain.components.spec.registry import SPEC_CLASSES
from posttrain.components.spec.rewards import BUILTIN_REWARDS
from posttrain.components.spec.schema import Spec
from posttrain.components.spec.sections import USER_CODE_TIMEOUT_S
from posttrain.components.spec.values import Range, rows_for

DRAFT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_DIR = Path(__file__).resolve().parents[1] / "generated" / "schemas"

# The field table's kinds as JSON Schema types; "any" and "choice" are handled apart.
JSON_TYPES = {
    "bool": "boolean",
    "int": "integer",
    "float": "number",
    "list": "array",
    "dict": "object",
    "str": "string",
}

# what an evaluation's fields are, in posttrain.eval's spec and in a training spec's evaluate: section alike
_EVALUATION_NOTES: Dict[str, str] = {
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
        "lockstep, or the role generating ahead of training (docs: Generating with vLLM).",
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
    },
    "EvalSpec": {
        **_EVALUATION_NOTES,
        "algorithm": "eval: posttrain.eval's spec.",
        "output_dir": "Where the results go: eval_summary.json, eval_samples.jsonl, eval.png.",
        "models": "The models to evaluate, by name (lowercase letters, digits and _), the baseline first; each a "
        "model section as in training.",
        "require": "Conditions on the scores (e.g. sft.contains - base.contains >= 0.05): the job fails in one "
        "line where one does not hold.",
        "overwrite_output_dir": "Replace another evaluation's results in output_dir.",
    },
    "EvaluateSection": {
        **_EVALUATION_NOTES,
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
        "config": "The hub data set's configuration (subset).",
        "split": "The split to read: of a hub data set, or of a saved DatasetDict.",
        "columns": "This source's own column renames, found -> expected, beside data.columns.",
        "max_rows": "Keep this source's first max_rows rows only.",
        "weight": "How often an interleaved mixture draws from this source, against the others' weights.",
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


def field_schema(field: FieldType) -> Dict[str, Any]:
    """A field table entry as a JSON Schema.

    >>> field_schema(FieldType(("int",), nullable=True))
    {'type': ['integer', 'null']}
    >>> field_schema(FieldType(("choice",), choices=("linear", "cosine")))
    {'enum': ['linear', 'cosine']}
    >>> field_schema(FieldType(("bool", "choice"), choices=("all",)))
    {'anyOf': [{'type': 'boolean'}, {'enum': ['all']}]}
    >>> field_schema(FieldType(("any",), nullable=False))
    {}
    """
    # FieldType.check accepts any value for these
    if "any" in field.kinds:
        return {}
    types = [JSON_TYPES[kind] for kind in field.kinds if kind != "choice"]
    if field.nullable:
        types.append("null")
    typed = {"type": types[0] if len(types) == 1 else types}
    if field.choices is None:
        return typed
    if not types or types == ["null"]:
        return {"enum": list(field.choices) + ([None] if field.nullable else [])}
    # a list of choices (DPO's loss_type)
    if "list" in field.kinds:
        typed["items"] = {"enum": list(field.choices)}
    return {"anyOf": [typed, {"enum": list(field.choices)}]}


def table_schema(class_name: str, *, exclude: Sequence[str] = ()) -> Dict[str, Any]:
    """An object whose properties are one config class's fields, with their defaults and ranges; nothing else."""
    # the raw table: it says which defaults exist
    entries = json.loads(TABLE_PATH.read_text())[class_name]
    fields = config_fields(class_name)
    rows = rows_for(class_name, fields)
    ranges = {row["field"]: Range.parse(row["range"]) for row in rows if "range" in row}
    patterns = {row["field"]: row["pattern"] for row in rows if "pattern" in row}
    keys: Dict[str, List[str]] = {}
    for row in rows:
        keys.setdefault(row["field"], []).extend(row.get("keys", []))
    properties = {}
    for name, field in fields.items():
        if name in exclude:
            continue
        prop = field_schema(field)
        # the validator's ranges; they apply to numbers only, so null stays allowed
        if name in ranges:
            bounds = ranges[name]
            if bounds.low is not None:
                prop["minimum" if bounds.low_inclusive else "exclusiveMinimum"] = bounds.low
            if bounds.high is not None:
                prop["maximum" if bounds.high_inclusive else "exclusiveMaximum"] = bounds.high
        # constrains text only, so null stays allowed
        if name in patterns:
            prop["pattern"] = patterns[name]
        # the keys a mapping may hold under any condition; propertyNames constrains objects only
        if keys.get(name):
            prop["propertyNames"] = {"enum": sorted(set(keys[name]))}
        if "default" in entries[name]:
            prop["default"] = entries[name]["default"]
        notes = [entries[name].get("help", "")] + [
            row["reason"]
            for row in rows
            if row["field"] == name and any(kind in row for kind in ("range", "choices", "pattern"))
        ]
        prop["description"] = " ".join(f"{note[:1].upper()}{note[1:]}".rstrip(".") + "." for note in notes if note)
        properties[name] = _as_pyyaml_reads(prop, field)
    return {"type": "object", "properties": properties, "additionalProperties": False}


def _as_pyyaml_reads(prop: Dict[str, Any], field: FieldType) -> Dict[str, Any]:
    """A field's schema that also takes what PyYAML (YAML 1.1) reads otherwise than written, where the validator
    takes it as written (``spec.loading.as_written_by_yaml_1_1``): ``3e-3`` (text to PyYAML) for a number, ``no`` (false to
    PyYAML) for the choice. A user's own check, PyYAML then jsonschema, passes what posttrain passes."""
    also = []
    if "float" in field.kinds and "str" not in field.kinds:
        also.append({"type": "string", "pattern": EXPONENT_NUMBER.pattern})
    if field.choices and "bool" not in field.kinds:
        also += [{"const": value} for value, words in BOOLEAN_WORDS.items() if set(words) & set(field.choices)]
    if not also:
        return prop
    kept = {key: prop.pop(key) for key in ("description", "default") if key in prop}
    return {"anyOf": [prop, *also], **kept}


def training_schema(cls: Type[Spec]) -> Dict[str, Any]:
    """``training``: the TRL config's fields less the ones posttrain owns (those are errors, as in the validator)."""
    owned, refused = cls.owned_keys, cls.refused_keys
    schema = table_schema(cls.config_class, exclude=[*owned, *refused])
    pointers = "; ".join(f"{key}: {where}" for key, where in sorted({**owned, **refused}.items()))
    schema["description"] = f"Fields of {cls.config_class} (from config_fields.json). Not allowed here: {pointers}."
    schema["required"] = ["output_dir"]
    return schema


def lora_schema(cls: Type[Spec]) -> Dict[str, Any]:
    """``model.lora``: PEFT's LoraConfig fields."""
    schema = table_schema(LORA_CONFIG)
    schema["description"] = f"Fields of {LORA_CONFIG} (from config_fields.json); task_type defaults to {cls.lora_task}."
    return schema


def _strip_titles(node: Any) -> Any:
    """Drops pydantic's generated titles ("Name Or Path"): noise in hover text. Property names are kept."""
    if isinstance(node, list):
        return [_strip_titles(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "title":
            continue
        # maps of names: each value is a schema
        if key in ("properties", "$defs"):
            out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
        else:
            out[key] = _strip_titles(value)
    return out


def _describe(properties: Dict[str, Any], notes: Mapping[str, str]) -> None:
    for name, note in notes.items():
        if name in properties and "description" not in properties[name]:
            properties[name]["description"] = note
    # posttrain's own numbers (rewards[].weight): PyYAML reads 1e-3 as text
    for name, prop in properties.items():
        alternatives = prop.get("anyOf", [prop])
        if {"type": "number"} in alternatives or prop.get("type") == "number":
            number = {key: prop.pop(key) for key in list(prop) if key not in ("description", "default")}
            text = {"type": "string", "pattern": EXPONENT_NUMBER.pattern}
            prop["anyOf"] = [*number.get("anyOf", [number]), text]


def spec_schema(algorithm: str) -> Dict[str, Any]:
    """The JSON Schema of one algorithm's spec."""
    cls = SPEC_CLASSES[algorithm]
    generated = _strip_titles(cls.model_json_schema())
    defs = generated.get("$defs", {})
    properties = generated["properties"]
    properties["training"] = training_schema(cls)
    defs["ModelSpec"]["properties"]["lora"] = {
        "anyOf": [lora_schema(cls), {"type": "null"}],
        "default": None,
        "description": "LoRA adapters (PEFT LoraConfig fields) instead of full fine-tuning.",
    }
    if "rewards" in properties:
        # the validator asks for at least one
        properties["rewards"]["minItems"] = 1
    _describe(properties, FIELD_NOTES[""])
    for name, notes in FIELD_NOTES.items():
        if name in defs:
            _describe(defs[name]["properties"], notes)
    return {
        "$schema": DRAFT,
        "title": f"posttrain {algorithm} spec",
        **generated,
    }


def eval_schema() -> Dict[str, Any]:
    """The JSON Schema of ``posttrain.eval``'s spec."""
    generated = _strip_titles(EvalSpec.model_json_schema())
    # an evaluation loads models as they are (the validator refuses an adapter and quantization)
    for refused in ("lora", "quantization"):
        del generated["$defs"]["ModelSpec"]["properties"][refused]
    _describe(generated["properties"], FIELD_NOTES["EvalSpec"])
    for name, notes in FIELD_NOTES.items():
        if name in generated.get("$defs", {}):
            _describe(generated["$defs"][name]["properties"], notes)
    return {"$schema": DRAFT, "title": "posttrain eval spec", **generated}


def chain_schema() -> Dict[str, Any]:
    """The JSON Schema of ``posttrain.chain``'s spec: each stage is checked as a spec of its own by the validator
    (its file, or its inline sections), so the schema holds the chain's own keys."""
    stage = {
        "type": "object",
        "description": "A stage: a spec written inline, or spec: <path> with sections of its own on top (a mapping "
        "merges key by key); ${stages.<name>.output} is an earlier stage's output directory.",
        "properties": {
            "spec": {"type": "string", "description": "A spec file, relative to the chain's file."},
        },
    }
    return {
        "$schema": DRAFT,
        "title": "posttrain chain spec",
        "type": "object",
        "properties": {
            "algorithm": {"const": ALGORITHM, "description": "chain: stages run one after another in one job."},
            "output_dir": {
                "type": "string",
                "description": "The chain's directory: stage <name> writes <output_dir>/<name>.",
            },
            "stages": {
                "type": "object",
                "description": "Named stages (lowercase letters, digits and _), in the order they run.",
                "minProperties": 1,
                "additionalProperties": stage,
            },
        },
        "required": ["algorithm", "output_dir", "stages"],
        "additionalProperties": False,
    }


# the schemas besides the algorithms': posttrain.eval's and posttrain.chain's specs
OTHER_SCHEMAS: Dict[str, Callable[[], Dict[str, Any]]] = {"eval": eval_schema, "chain": chain_schema}
# every schema, by the algorithm a spec names
SCHEMA_NAMES = sorted([*SPEC_CLASSES, *OTHER_SCHEMAS])


def render(algorithm: str) -> str:
    """The canonical text of ``schemas/<algorithm>.schema.json`` (``eval`` and ``chain`` too)."""
    schema = OTHER_SCHEMAS[algorithm]() if algorithm in OTHER_SCHEMAS else spec_schema(algorithm)
    return json.dumps(schema, indent=1) + "\n"


def schema_path(algorithm: str, directory: Path = SCHEMA_DIR) -> Path:
    return directory / f"{algorithm}.schema.json"


def write_each_algorithm(render_one: Callable[[str], str], path_of: Callable[[str], Path]) -> List[Path]:
    """Writes one generated file per algorithm (a schema, a reference page); returns the paths written."""
    written = []
    for algorithm in sorted(SPEC_CLASSES):
        path = path_of(algorithm)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_one(algorithm))
        written.append(path)
    return written


def write_all(directory: Path = SCHEMA_DIR) -> List[Path]:
    """Writes every schema into ``directory`` (each algorithm's, the eval's and the chain's); returns the paths
    written."""
    written = write_each_algorithm(render, lambda algorithm: schema_path(algorithm, directory))
    for name in OTHER_SCHEMAS:
        path = schema_path(name, directory)
        path.write_text(render(name))
        written.append(path)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m posttrain.components.generate.schema_json", description="JSON Schemas of posttrain's specs."
    )
    parser.add_argument("algorithm", nargs="?", choices=SCHEMA_NAMES, help="print this algorithm's schema")
    parser.add_argument(
        "--all",
        nargs="?",
        const=SCHEMA_DIR,
        type=Path,
        metavar="DIR",
        help=f"write <algorithm>.schema.json for every algorithm into DIR (default {SCHEMA_DIR})",
    )
    args = parser.parse_args(argv)
    if (args.algorithm is None) == (args.all is None):
        parser.error("give an algorithm or --all")
    if args.all is not None:
        for path in write_all(args.all):
            print(f"wrote {path}")
    else:
        sys.stdout.write(render(args.algorithm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
