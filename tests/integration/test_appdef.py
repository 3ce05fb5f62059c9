"""Each side imports only what it needs, each in an interpreter of its own: the client no torch or TRL, the job
no torchx, and a job reads its spec without the AppDef builder. (The AppDef: ``tests/unit/components/test_appdef.py``.)"""

import subprocess
import sys

import pytest

from helpers import REPO


@pytest.mark.parametrize(
    "modules, absent",
    [
        # the client: --dryrun and `torchx builtins` stay fast
        (
            "posttrain.components, posttrain.components.algorithms",
            ("torch", "trl", "transformers", "deepspeed", "peft", "datasets", "pyarrow"),
        ),
        # the training processes read the spec without the AppDef's machinery (21 ms less start-up per process:
        # torchx.specs, docstring_parser, importlib_metadata)
        ("posttrain.entrypoints.job.runtime, posttrain.entrypoints.vllm_server", ("torchx", "docstring_parser")),
    ],
    ids=["client", "job"],
)
def test_each_side_imports_only_what_it_needs(modules: str, absent: tuple) -> None:
    code = f"import sys, {modules}; print(sorted(m for m in sys.modules if m.split('.')[0] in {absent!r}))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stdout.strip() == "[]"


def test_a_job_reads_its_spec_without_the_appdef_builder() -> None:
    code = (
        "import sys, posttrain.components.spec.loading; "
        "print('posttrain.components.appdef' in sys.modules, 'posttrain.components.algorithms' in sys.modules); "
        "from posttrain.components import SpecError, sft; print(SpecError.__name__, sft.__name__)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stdout.split() == ["False", "False", "SpecError", "sft"]
