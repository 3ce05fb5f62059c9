"""A chain: named stages, each a whole spec, run one after another in one job, each handing its model on.

    algorithm: chain
    output_dir: outputs/rlhf-tiny          # stage <name> writes <output_dir>/<name>
    stages:
      sft: {spec: ../sft/tiny.yaml}
      reward: {spec: ../reward/tiny.yaml, model: {name_or_path: "${stages.sft.output}"}}
      ppo:
        spec: ../ppo/tiny.yaml
        model: {name_or_path: "${stages.sft.output}"}
        rewards: [{model: "${stages.reward.output}"}]

A stage is a spec written inline, or ``spec: <path>`` (relative to the
chain's file, or a shipped template's name: ``spec: sft/tiny``) with
sections of its own on top: a mapping merges into the file's key by key,
anything else replaces it. ``${stages.<name>.output}`` is
an earlier stage's output directory; the chain sets each stage's
``training.output_dir``. Overrides address a stage as
``stages.<name>.<key.path>=value``, the chain's own directory as
``output_dir=...``.

A stage may be an evaluation (``algorithm: eval``, components/spec/evaluation.py) of
earlier stages' models: its ``require:`` conditions gate the stages after it;
the chain sets its ``output_dir`` and lets it replace its own earlier results.

Each stage is validated as if submitted alone, its problems named
``stages.<name>.<key>``; then what only a chain can get wrong: a reference to
a stage that does not exist or comes later, a model where the next stage
needs another kind (a reward model as a policy), a stage that needs a vLLM
server role.
"""

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from posttrain.components.spec import evaluation
from posttrain.components.spec.data_sources import seed_overlaps
from posttrain.components.spec.evaluation import EvalSpec, validate_eval
from posttrain.components.spec.generation import runs_vllm_server
from posttrain.components.spec.loading import as_written_by_yaml_1_1, read_yaml, validate
from posttrain.components.spec.messages import SpecError, cut
from posttrain.components.spec.overrides import apply_overrides
from posttrain.components.spec.schema import Spec
from posttrain.components.spec.shipped import spec_file, template_file

ALGORITHM = "chain"
# set in each stage's processes: the stage's name (its closing line is the chain's; fault injection can aim at it)
STAGE_ENV = "POSTTRAIN_CHAIN_STAGE"
STAGE_NAME = re.compile(r"[a-z][a-z0-9_]*")
# any other ${...} is the stage's own text
REFERENCE = re.compile(r"\$\{(stages\.[^}]*)\}")
OUTPUT_REFERENCE = re.compile(r"stages\.([^.]+)\.output")
# what a reward stage writes
SEQUENCE_CLASSIFIER = "AutoModelForSequenceClassification"


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    # a training run's, or an evaluation's (a gate: its require: conditions stop the chain)
    spec: Union[Spec, EvalSpec]

    @property
    def output_dir(self) -> str:
        return self.spec.output_dir if isinstance(self.spec, EvalSpec) else self.spec.training["output_dir"]


@dataclasses.dataclass(frozen=True)
class Chain:
    """A validated chain: its directory and its stages, in order."""

    output_dir: str
    stages: Tuple[Stage, ...]

    def to_json(self) -> str:
        """Canonical JSON, as ``Spec.to_json``: what the job is given and checks its finished stages against."""
        stages = {stage.name: json.loads(stage.spec.to_json()) for stage in self.stages}
        # not sort_keys: the stages' order is the chain's (each stage's spec is sorted already)
        return json.dumps({"algorithm": ALGORITHM, "output_dir": self.output_dir, "stages": stages})


def load_chain(path: str, overrides: Sequence[str] = (), *, world_size: Optional[int] = None) -> Chain:
    """Reads a chain's YAML (a path, or a shipped template's name: ``chain/rlhf-tiny``), applies
    ``stages.<name>.<key.path>=value`` overrides and validates every stage."""
    path = spec_file(path)
    raw = read_yaml(path)
    return validate_chain(raw, overrides, base=Path(path).parent, world_size=world_size)


def chain_from_json(text: str) -> Chain:
    """Parses a chain serialised by :meth:`Chain.to_json`, each stage's spec validated again (its references
    resolved and its output_dir set already)."""
    raw = json.loads(text)
    return Chain(raw["output_dir"], tuple(Stage(name, _validated(spec)) for name, spec in raw["stages"].items()))


def _validated(raw: Dict[str, Any], world_size: Optional[int] = None) -> Union[Spec, EvalSpec]:
    """A stage's spec validated as its algorithm's: an evaluation's, or a training run's."""
    if raw.get("algorithm") == evaluation.ALGORITHM:
        return validate_eval(raw)
    return validate(raw, world_size=world_size)


def validate_chain(
    raw: Mapping[str, Any], overrides: Sequence[str] = (), *, base: Path, world_size: Optional[int] = None
) -> Chain:
    """Validates a chain as plain data; raises SpecError listing every problem, each naming its stage."""
    unknown = sorted(set(raw) - {"algorithm", "output_dir", "stages"})
    problems = [f"{key}: unknown key; a chain has algorithm, output_dir and stages" for key in unknown]
    if raw.get("algorithm") != ALGORITHM:
        problems.append(f"algorithm: expected chain for posttrain.chain; got {cut(repr(raw.get('algorithm')))}")
    chain_overrides, stage_overrides = _split_overrides(overrides)
    output_dir = chain_overrides.get("output_dir", raw.get("output_dir"))
    if not isinstance(output_dir, str) or not output_dir.strip():
        problems.append("output_dir: required; the directory each stage writes its own directory in")
    stages = raw.get("stages")
    if not isinstance(stages, dict) or not stages:
        problems.append("stages: required; a mapping of stage names to specs, run in order")
    if problems:
        raise SpecError(problems)
    problems += [
        f"stages.{name}: a stage's name is lowercase letters, digits and _, starting with a letter"
        for name in stages
        if not isinstance(name, str) or not STAGE_NAME.fullmatch(name)
    ]
    problems += [
        f"override stages.{name}...: no stage {name!r} in this chain; it has {', '.join(stages)}"
        for name in stage_overrides
        if name not in stages
    ]
    if problems:
        raise SpecError(problems)

    outputs = {name: str(Path(output_dir) / name) for name in stages}
    validated: List[Stage] = []
    for index, (name, written) in enumerate(stages.items()):
        where = f"stages.{name}"
        try:
            stage_raw = _stage_raw(written, base, where)
            # where the stage's spec names its directory: an evaluation's at the top, a training run's in training
            key = "output_dir" if stage_raw.get("algorithm") == evaluation.ALGORITHM else "training.output_dir"
            section, _, field = key.rpartition(".")
            own = (written.get(section) or {}) if section and isinstance(written, dict) else written
            if (isinstance(own, dict) and field in own) or any(
                o.lstrip("~").startswith(key) for o in stage_overrides.get(name, ())
            ):
                raise SpecError([f"{where}.{key}: the chain sets it ({outputs[name]}); set the chain's output_dir"])
            if key == "output_dir" and (
                "overwrite_output_dir" in written
                or any(o.lstrip("~").startswith("overwrite_output_dir") for o in stage_overrides.get(name, ()))
            ):
                raise SpecError(
                    [
                        f"{where}.overwrite_output_dir: the chain sets it (true): an evaluation stage's directory is "
                        "the chain's, its results replaced when its models or spec change"
                    ]
                )
            as_written_by_yaml_1_1(stage_raw, EvalSpec if key == "output_dir" else None)
            stage_raw = apply_overrides(stage_raw, stage_overrides.get(name, ()))
            stage_raw = _resolve(stage_raw, name, list(stages)[:index], outputs, where)
            if key == "output_dir":
                # the chain's own directory: results of the stage's earlier models or spec are replaced
                stage_raw.update(output_dir=outputs[name], overwrite_output_dir=True)
            else:
                stage_raw.setdefault("training", {})
                if isinstance(stage_raw["training"], dict):
                    stage_raw["training"]["output_dir"] = outputs[name]
            validated.append(Stage(name, _validated(stage_raw, world_size)))
        except SpecError as error:
            problems += [_in_stage(problem, where) for problem in error.problems]
    if problems:
        raise SpecError(problems)
    chain = Chain(output_dir, tuple(validated))
    problems += _handover_problems(chain) + _held_out_problems(chain)
    if problems:
        raise SpecError(problems)
    return chain


def _in_stage(problem: str, where: str) -> str:
    """A stage's problem as the chain's: its keys under ``stages.<name>``."""
    if problem.startswith("stages."):
        return problem
    # the override as the user wrote it
    if problem.startswith("override '"):
        return problem.replace("override '", f"override '{where}.", 1)
    return f"{where}.{problem}".replace("; did you mean ", f"; did you mean {where}.")


def _split_overrides(overrides: Sequence[str]) -> Tuple[Dict[str, str], Dict[str, List[str]]]:
    """``output_dir=...`` for the chain; ``stages.<name>.<key.path>=value`` (or ``~stages.<name>...``) per stage."""
    chain: Dict[str, str] = {}
    stages: Dict[str, List[str]] = {}
    for override in overrides:
        removal = override.startswith("~")
        key, sep, value = override.lstrip("~").partition("=")
        parts = key.strip().split(".", 2)
        if key.strip() == "output_dir" and sep and not removal:
            chain["output_dir"] = value.strip()
        elif len(parts) == 3 and parts[0] == "stages" and (sep or removal):
            stages.setdefault(parts[1], []).append(("~" if removal else "") + parts[2] + sep + value)
        else:
            raise SpecError(
                [
                    f"override {cut(repr(override))}: a chain's overrides are stages.<name>.<key.path>=value "
                    "(e.g. stages.sft.training.max_steps=10) or output_dir=<path>"
                ]
            )
    return chain, stages


def _stage_raw(written: Any, base: Path, where: str) -> Dict[str, Any]:
    """A stage as a spec's mapping: inline, or ``spec: <path>`` with the stage's own sections merged on top."""
    if not isinstance(written, dict):
        raise SpecError([f"{where}: expected a spec (a mapping), or spec: <path> with sections to change"])
    written = json.loads(json.dumps(written))
    path = written.pop("spec", None)
    if path is None:
        return written
    if not isinstance(path, str):
        raise SpecError([f"{where}.spec: expected the path of a spec file; got {cut(repr(path))}"])
    return _merged(read_yaml(stage_file(base, path), where=f"{where}.spec"), written)


def stage_file(base: Path, path: str) -> str:
    """A stage's spec file: relative to the chain's file (in ``base``), else a shipped template by its name
    (``sft/tiny``)."""
    beside = base / path
    template = None if beside.is_file() else template_file(path)
    return str(beside) if template is None else str(template)


def _merged(file: Dict[str, Any], changes: Mapping[str, Any]) -> Dict[str, Any]:
    merged = dict(file)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def _resolve(value: Any, stage: str, earlier: List[str], outputs: Dict[str, str], where: str) -> Any:
    """``value`` with each ``${stages.<name>.output}`` replaced by that earlier stage's output directory."""
    if isinstance(value, dict):
        return {key: _resolve(item, stage, earlier, outputs, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, list):
        return [_resolve(item, stage, earlier, outputs, f"{where}.{index}") for index, item in enumerate(value)]
    if not isinstance(value, str):
        return value

    def output(match: "re.Match[str]") -> str:
        reference = OUTPUT_REFERENCE.fullmatch(match.group(1).strip())
        if reference is None:
            raise SpecError(
                [f"{where}: {match.group(0)}: a chain refers to an earlier stage's model as ${{stages.<name>.output}}"]
            )
        name = reference.group(1)
        if name == stage or name not in outputs:
            known = ", ".join(earlier) or "none: this is the first stage"
            raise SpecError([f"{where}: {match.group(0)}: no earlier stage {name!r} (earlier stages: {known})"])
        if name not in earlier:
            raise SpecError(
                [
                    f"{where}: {match.group(0)}: stage {name!r} runs after {stage!r}; a stage takes "
                    "the output of an earlier one"
                ]
            )
        return outputs[name]

    return REFERENCE.sub(output, value)


def _handover_problems(chain: Chain) -> List[str]:
    """A stage that takes an earlier stage's model as a kind that stage does not write; a vLLM server role."""
    writes = {stage.output_dir: stage for stage in chain.stages}
    problems = []
    for stage in chain.stages:
        for where, path, needs_scores in _models_taken(stage.spec):
            source = writes.get(path)
            if source is not None and isinstance(source.spec, EvalSpec):
                problems.append(
                    f"stages.{stage.name}.{where}: stage {source.name!r} is an evaluation; it writes scores, no model"
                )
                continue
            if source is None or needs_scores is None:
                continue
            scores = source.spec.model_class == SEQUENCE_CLASSIFIER
            if scores != needs_scores:
                wrote = "a reward model (one score per sequence)" if scores else "a causal LM"
                wanted = "a reward model: a reward stage's output" if needs_scores else "a causal LM (a policy)"
                problems.append(
                    f"stages.{stage.name}.{where}: stage {source.name!r} ({source.spec.name()}) writes {wrote}, "
                    f"and {where} takes {wanted}"
                )
        if isinstance(stage.spec, Spec) and runs_vllm_server(stage.spec.training):
            problems.append(
                f"stages.{stage.name}.training.vllm_mode: server needs a vllm role beside the trainers, which a "
                "chain does not run; use vllm_mode: colocate, or a server of your own (vllm_server_base_url)"
            )
    return problems


def _held_out_problems(chain: Chain) -> List[str]:
    """A stage's held-out rows (an evaluation's, a training stage's data.eval or evaluate:) generated from seeds an
    earlier stage trained on (its own training rows are its spec's to check)."""
    problems = []
    for index, stage in enumerate(chain.stages):
        spec = stage.spec
        sections = [("", spec.data)]
        if isinstance(spec, Spec) and spec.evaluate is not None:
            sections.append(("evaluate.", spec.evaluate.data))
        held_out = [
            (f"stages.{stage.name}.{prefix}{where}", source)
            for prefix, data in sections
            if data is not None
            for where, source in data.sources("eval")
        ]
        trained = [
            (f"stages.{earlier.name}.{where}", source)
            for earlier in chain.stages[:index]
            if isinstance(earlier.spec, Spec)
            for where, source in earlier.spec.data.sources("train")
        ]
        problems += seed_overlaps(trained, held_out)
    return problems


def _models_taken(spec: Union[Spec, EvalSpec]) -> Iterator[Tuple[str, str, Optional[bool]]]:
    """Each model a spec loads: where it is named, the path or id, and whether it must score sequences (True),
    must generate (False), or may be either (None: a reward model starts from a causal LM or a reward model)."""
    if isinstance(spec, EvalSpec):
        # each samples completions
        for where, name_or_path in spec.named_models():
            yield where, name_or_path, False
        return
    yield "model.name_or_path", spec.model.name_or_path, None if spec.model_class == SEQUENCE_CLASSIFIER else False
    for field in ("reference_model", "teacher_model"):
        if isinstance(getattr(spec, field, None), str):
            yield field, getattr(spec, field), False
    for index, reward in enumerate(getattr(spec, "rewards", None) or []):
        if reward.model is not None:
            yield f"rewards.{index}.model", reward.model, True
