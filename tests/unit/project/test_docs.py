"""The documentation site's reference pages match the code. (The site built and searched in headless Chromium:
``tests/integration/test_docs.py``.)"""

import re
from pathlib import Path

import pytest

from helpers import REPO
from posttrain.components.generate import reference
from posttrain.components.spec.evaluation import EvalSpec
from posttrain.components.spec.registry import SPEC_CLASSES
from posttrain.components.spec.sections import DataSource, RewardSource
from posttrain.entrypoints.inputs.data import load_data
from posttrain.entrypoints.inputs.rewards import resolve_rewards

# each algorithm's data shapes, and an evaluation's
FORMATS = {**{name: cls.data_formats for name, cls in SPEC_CLASSES.items()}, "eval": EvalSpec.data_formats}


@pytest.mark.parametrize("algorithm", sorted(SPEC_CLASSES))
def test_the_reference_pages_match_the_code(algorithm: str) -> None:
    page = reference.page_path(algorithm).read_text()
    assert page == reference.render(algorithm), "stale: run python -m posttrain.components.generate.reference --all"
    for key in ("training.output_dir", "training.learning_rate", "model.name_or_path", "distributed.timeout_s"):
        assert f"| `{key}` |" in page, key
    # a refused key, with its reason
    assert "| `training.ddp_timeout` | use distributed.timeout_s |" in page


def test_the_page_that_sets_the_algorithms_side_by_side_matches_their_descriptions() -> None:
    page = reference.CHOOSING_PATH.read_text()
    assert page == reference.render_choosing(), "stale: run python -m posttrain.components.generate"
    assert all(f"[`posttrain.{algorithm}`]({algorithm}.md)" in page for algorithm in SPEC_CLASSES)


def test_the_sft_reference_gives_posttrains_defaults_of_the_fast_path_keys_beside_trls() -> None:
    rows = {line.split(" | ")[0].strip("| `"): line for line in reference.render("sft").splitlines()}
    for key, trl in (
        ("padding_free", "`false`"),
        ("per_device_train_batch_size", "`8`"),
        ("activation_checkpointing", "`null`"),
        ("use_liger_kernel", "`false`"),
    ):
        default = rows[f"training.{key}"].split(" | ")[2]
        assert default.startswith("posttrain: ") and default.endswith(f"(TRL: {trl})"), default
    # TRL's help as text: no argparse escapes, links as Markdown's
    assert "%%" not in reference.render("sft") and "&lt;a href" not in reference.render("grpo")


@pytest.mark.parametrize("algorithm", sorted(SPEC_CLASSES))
def test_the_attention_default_is_torch_varlen_on_gpus_where_the_algorithm_trains_padding_free(algorithm: str) -> None:
    rows = {line.split(" | ")[0].strip("| `"): line for line in reference.render(algorithm).splitlines()}
    default = rows["model.attn_implementation"].split(" | ")[2]
    if "padding_free" in SPEC_CLASSES[algorithm].fast_paths:
        assert default.startswith("posttrain: on GPUs, torch_varlen"), default
    else:
        assert default == "`null`", default


@pytest.mark.parametrize("algorithm", sorted(SPEC_CLASSES))
def test_a_page_lists_no_key_of_a_section_its_algorithm_refuses(algorithm: str) -> None:
    page = reference.render(algorithm)
    for section, why in SPEC_CLASSES[algorithm].refused_sections.items():
        assert f"| `{section}` |" not in page.split("### Sections posttrain refuses")[0], section
        assert f"| `{section}.` " not in page and f"## `{section}`" not in page, section
        assert f"| `{section}` | {why} |" in page


def test_each_example_row_of_your_data_passes_the_jobs_data_checks_for_its_algorithms(tmp_path: Path) -> None:
    """docs/pages/your-data.md: every row of a section's block loads, alone, as each algorithm of its heading reads
    its data (the job's own loader and checks)."""
    page = (REPO / "docs/pages/your-data.md").read_text()
    checked = set()
    for heading, block in re.findall(r"^## (.*?)\n.*?```jsonl\n(.*?)```", page, re.S | re.M):
        algorithms = [name for name in re.findall(r"`(\w+)`", heading) if name in FORMATS]
        assert algorithms, heading
        for number, row in enumerate(block.splitlines()):
            path = tmp_path / f"{algorithms[0]}-{number}.jsonl"
            path.write_text(row + "\n")
            for algorithm in algorithms:
                load_data(DataSource(path=str(path)), {}, "data.train", FORMATS[algorithm])
                checked.add(algorithm)
    assert checked == set(FORMATS)


def test_the_reward_module_of_the_docs_imports_and_scores_as_the_job_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/pages/rewards-and-ppo.md's my_rewards.py, imported from the working directory as the job does."""
    page = (REPO / "docs/pages/rewards-and-ppo.md").read_text()
    module = re.search(r"^## Your own reward\n.*?```python\n(.*?)```", page, re.S | re.M).group(1)
    (tmp_path / "my_rewards.py").write_text(module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    [accuracy] = resolve_rewards([RewardSource(function="my_rewards:accuracy")])
    completions = [
        [{"role": "assistant", "content": "It has 2398 boxes left."}],
        [{"role": "assistant", "content": "12"}],
    ]
    scores = accuracy(prompts=["p", "p"], completions=completions, answer=["2398", "2398"], completion_ids=[[], []])
    assert scores == [1.0, 0.0]
    assert accuracy(prompts=["p"], completions=["2398"], answer=["2398"]) == [1.0]


def test_every_test_the_docs_name_exists() -> None:
    """A promise's "held by" names real tests: `tests/<path>.py`, `tests/<path>.py::test_name` and, after one of
    those, `::test_name` in the same file."""
    missing = []
    for page in sorted((REPO / "docs/pages").rglob("*.md")):
        current = None
        for match in re.finditer(r"`(tests/[\w/]+\.py)(?:::(\w+)[^`]*)?`|`::(\w+)[^`]*`", page.read_text()):
            path, name = (match[1], match[2]) if match[1] else (current, match[3])
            current = path
            source = REPO / path if path else None
            if source is None or not source.is_file():
                missing.append(f"{page.name}: {path}")
            elif name and not re.search(rf"^(async )?def {name}\(", source.read_text(), re.MULTILINE):
                missing.append(f"{page.name}: {path}::{name}")
    assert missing == []
