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
from typing import Any, ClassVar, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union

from pydantic import ValidationError

from posttrain.components.spec import conditions
from posttrain.components.spec.loading import as_written_by_yaml_1_1, read_yaml
from posttrain.components.spec.messages import SpecError, cut, known_paths, translate, unknown_in
from posttrain.components.spec.overrides import apply_overrides
from posttrain.components.spec.registry import PROMPT_FORMATS
from posttrain.components.spec.schema import DataSource, DataSpec, ModelSpec, RewardSource, _Strict

ALGORITHM = "eval"
# how a model is named in ``models`` (and in ``require:``'s conditions)
MODEL_NAME = re.compile(r"[a-z][a-z0-9_]*")


class EvalData(DataSpec):
    """The prompts to evaluate on: ``data.eval`` (one source or a mixture), with the sections' usual renames."""

    train: None = None
    eval: Union[DataSource, List[DataSource]]


class GenerationSpec(_Strict):
    """How each model samples: ``num_samples`` completions per prompt of up to ``max_new_tokens``; temperature 0
    is greedy. Only these settings: nothing is taken from a model's own generation config but its end token."""

    num_samples: int = 1
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


class EvalSpec(_Strict):
    """An evaluation's spec (``posttrain.eval``)."""

    algorithm: Literal["eval"]
    output_dir: str
    models: Dict[str, ModelSpec]
    data: EvalData
    rewards: List[RewardSource]
    generation: GenerationSpec = GenerationSpec()
    # k of pass@k: the chance that at least one of k samples passes (scores 1), from the num_samples drawn
    pass_at_k: List[int] = [1]
    # what the scores must show for the job to succeed (components/spec/conditions.py)
    require: List[str] = []
    # write over another spec's results in output_dir
    overwrite_output_dir: bool = False

    # a prompt column, as GRPO's data
    data_formats: ClassVar[Tuple[Tuple[str, ...], ...]] = PROMPT_FORMATS

    @classmethod
    def name(cls) -> str:
        """``eval``: what a chain's stage names its algorithm by (as :meth:`Spec.name`)."""
        return ALGORITHM

    def named_models(self) -> List[Tuple[str, str]]:
        """Each model by where the spec names it: ``models.<name>.name_or_path``."""
        return [(f"models.{name}.name_or_path", model.name_or_path) for name, model in self.models.items()]

    def scorer_names(self) -> List[str]:
        """Each scorer's name in the summary: its built-in's or function's name, numbered where two share one."""
        # a function's own name (my_scores:Judge.correct: correct), as require's conditions can write it
        names = [
            reward.builtin or str(reward.function).rpartition(":")[2].rpartition(".")[2] for reward in self.rewards
        ]
        return [f"{name}_{index}" if names.count(name) > 1 else name for index, name in enumerate(names)]

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
        if not self.rewards:
            found.append("rewards: name at least one scorer (e.g. - builtin: contains, args: {column: answer})")
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
            if reward.model is not None:
                found.append(
                    f"rewards.{index}.model: posttrain.eval scores with built-ins and functions; a reward model's "
                    "scores are not yet read here: score with a function that calls it"
                )
        generation = self.generation
        if generation.num_samples < 1:
            found.append(f"generation.num_samples: expected 1 or more; got {generation.num_samples}")
        if generation.max_new_tokens < 1:
            found.append(f"generation.max_new_tokens: expected 1 or more; got {generation.max_new_tokens}")
        if generation.temperature < 0:
            found.append(f"generation.temperature: expected 0 (greedy) or more; got {generation.temperature}")
        if not 0 < generation.top_p <= 1:
            found.append(f"generation.top_p: expected a value in (0, 1]; got {generation.top_p}")
        elif generation.temperature == 0 and generation.top_p != 1:
            found.append(f"generation.top_p: {generation.top_p} does nothing when greedy (temperature 0); drop it")
        if not 0 <= generation.seed < 2**32:
            found.append(f"generation.seed: expected 0 to 2**32 - 1; got {generation.seed}")
        for k in self.pass_at_k:
            if not 1 <= k <= generation.num_samples:
                found.append(
                    f"pass_at_k: {k} needs at least {k} samples per prompt; expected 1 to generation.num_samples "
                    f"({generation.num_samples})"
                )
        if generation.temperature == 0 and generation.num_samples > 1:
            found.append(
                f"generation.num_samples: {generation.num_samples} greedy samples are one sample repeated; set a "
                "temperature above 0, or num_samples: 1"
            )
        found += conditions.problems(self.require, list(self.models), self.scorer_names(), self.pass_at_k)
        return found + self.data.problems()


def load_eval(path: str, overrides: Sequence[str] = ()) -> EvalSpec:
    """Reads an evaluation's YAML, applies ``key.path=value`` overrides and validates it."""
    raw = read_yaml(path)
    as_written_by_yaml_1_1(raw, EvalSpec)
    return validate_eval(apply_overrides(raw, overrides, ALGORITHM))


def eval_from_json(text: str) -> EvalSpec:
    """Parses a spec serialised by :meth:`EvalSpec.to_json`, validating it again."""
    return validate_eval(json.loads(text))


def validate_eval(raw: Mapping[str, Any]) -> EvalSpec:
    """Validates an evaluation's spec as plain data; raises SpecError listing every problem."""
    if raw.get("algorithm") != ALGORITHM:
        raise SpecError([f"algorithm: expected eval for posttrain.eval; got {cut(repr(raw.get('algorithm')))}"])
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
