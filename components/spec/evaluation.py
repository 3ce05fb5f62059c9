"""An evaluation: held-out prompts, completions sampled from one or more models, scored as GRPO's rewards are.

    algorithm: eval
    output_dir: outputs/eval-sft-tiny
    models:                                  # compared in this order: the first is the baseline
      base: {name_or_path: "builtin:tiny-llama"}
      sft: {name_or_path: outputs/sft-tiny}   # a path, a hub id, or a finished run's directory
    data:
      eval: {path: templates/data/questions_heldout.jsonl}
    generation: {num_samples: 4, temperature: 1.0, max_new_tokens: 24}
    rewards:                                 # the scorers: built-ins or functions, as in GRPO's rewards
      - builtin: contains
        args: {column: answer}
    pass_at_k: [1, 4]
    require: [sft.regex_format - base.regex_format >= 0.3]   # else the job fails, in one line

Each prompt's samples come from a seed of its own (``generation.seed`` and
the prompt's place in the data), so the scores do not depend on how many
processes share the prompts.
"""

import json
import re
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple

from pydantic import ValidationError

from posttrain.components.spec.judging import Evaluation
from posttrain.components.spec.loading import as_written_by_yaml_1_1, read_yaml
from posttrain.components.spec.messages import SpecError, cut, known_paths, translate, unknown_in
from posttrain.components.spec.overrides import apply_overrides
from posttrain.components.spec.schema import TORCH_VARLEN, Spec
from posttrain.components.spec.sections import ModelSpec, with_taskset_rows
from posttrain.components.spec.shipped import spec_file

ALGORITHM = "eval"
# how a model is named in ``models`` (and in ``require:``'s conditions)
MODEL_NAME = re.compile(r"[a-z][a-z0-9_]*")
# where a training run's evaluation (its spec's evaluate: section) is written, inside its output_dir
TRAINING_RUN_DIR = "eval"


class EvalSpec(Evaluation):
    """An evaluation's spec (``posttrain.eval``): the models to evaluate beside what is evaluated
    (``Evaluation``)."""

    algorithm: Literal["eval"]
    output_dir: str
    models: Dict[str, ModelSpec]
    # write over another spec's results in output_dir
    overwrite_output_dir: bool = False

    @classmethod
    def name(cls) -> str:
        """``eval``: what a chain's stage names its algorithm by (as :meth:`Spec.name`)."""
        return ALGORITHM

    def named_models(self) -> List[Tuple[str, str]]:
        """Each model by where the spec names it: ``models.<name>.name_or_path``."""
        return [(f"models.{name}.name_or_path", model.name_or_path) for name, model in self.models.items()]

    def to_json(self) -> str:
        """Canonical JSON: what the job is given and checks a finished evaluation against."""
        return json.dumps(self.model_dump(mode="json"), separators=(",", ":"))

    def problems(self) -> List[str]:
        found = [] if self.output_dir.strip() else ["output_dir: required; the directory the results are written to"]
        if not self.models:
            found.append("models: name at least one model (e.g. trained: {name_or_path: outputs/sft-tiny})")
        for name, model in self.models.items():
            if not MODEL_NAME.fullmatch(name):
                found.append(
                    f"models.{name}: a model's name is lowercase letters, digits and _, starting with a letter"
                )
            if model.lora is not None:
                found.append(
                    f"models.{name}.lora: an evaluation loads models as they are, never adds an adapter; drop lora"
                )
            if model.quantization is not None:
                found.append(
                    f"models.{name}.quantization: an evaluation loads models in their dtype, never quantized; "
                    "drop quantization"
                )
        return found + self.evaluation_problems(list(self.models))


def of_training_run(spec: Spec) -> EvalSpec:
    """The evaluation a training spec's ``evaluate:`` section asks for, its job's to run once the model is saved:
    the saved model as ``after`` (and the starting one as ``before``) into ``<output_dir>/eval``, which belongs to
    the run (another ``evaluate:`` replaces what is there); with the spec's tools, environment and rounds of calls,
    where the section gives none of its own."""
    assert spec.evaluate is not None
    output_dir = str(spec.training["output_dir"]).rstrip("/")
    # as the models generate: torch_varlen trains only (it takes no KV cache); an adapter's base as it was, in its dtype
    attention = spec.model.attn_implementation
    start = spec.model.model_copy(
        update={
            "lora": None,
            "quantization": None,
            "attn_implementation": None if attention == TORCH_VARLEN else attention,
        }
    )
    models = {"before": start} if spec.evaluate.before else {}
    models["after"] = start.model_copy(update={"name_or_path": output_dir, "revision": None})
    section = spec.evaluation_section().model_dump(exclude={"before"})
    return EvalSpec.model_validate(
        {
            **section,
            "algorithm": ALGORITHM,
            "output_dir": f"{output_dir}/{TRAINING_RUN_DIR}",
            "models": models,
            "overwrite_output_dir": True,
        }
    )


def load_eval(path: str, overrides: Sequence[str] = ()) -> EvalSpec:
    """Reads an evaluation's YAML (a path, or a shipped template's name: ``eval/sft-tiny``), applies
    ``key.path=value`` overrides and validates it."""
    raw = read_yaml(spec_file(path))
    as_written_by_yaml_1_1(raw, EvalSpec)
    return validate_eval(apply_overrides(raw, overrides, ALGORITHM))


def eval_from_json(text: str) -> EvalSpec:
    """Parses a spec serialised by :meth:`EvalSpec.to_json`, validating it again."""
    return validate_eval(json.loads(text))


def validate_eval(raw: Mapping[str, Any]) -> EvalSpec:
    """Validates an evaluation's spec as plain data; raises SpecError listing every problem."""
    if raw.get("algorithm") != ALGORITHM:
        raise SpecError([f"algorithm: expected eval for posttrain.eval; got {cut(repr(raw.get('algorithm')))}"])
    raw = with_taskset_rows(raw, "eval")
    problems = list(unknown_in(raw, EvalSpec, "", list(known_paths(EvalSpec))))
    data = raw.get("data")
    if isinstance(data, dict) and data.get("train") is not None:
        problems.append("data.train: an evaluation reads its prompts from data.eval; move them there")
    if problems:
        raise SpecError(problems)
    spec: Optional[EvalSpec] = None
    try:
        spec = EvalSpec.model_validate(raw)
    except ValidationError as error:
        problems = translate(error)
    if spec is not None:
        problems = spec.problems()
    if problems:
        raise SpecError(problems)
    assert spec is not None
    return spec
