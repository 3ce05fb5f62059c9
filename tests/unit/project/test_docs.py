"""The documentation site's reference pages match the code. (The site built and searched in headless Chromium:
``tests/integration/test_docs.py``.)"""

import pytest

from posttrain.components.generate import reference
from posttrain.components.spec.registry import SPEC_CLASSES


@pytest.mark.parametrize("algorithm", sorted(SPEC_CLASSES))
def test_the_reference_pages_match_the_code(algorithm: str) -> None:
    page = reference.page_path(algorithm).read_text()
    assert page == reference.render(algorithm), "stale: run python -m posttrain.components.generate.reference --all"
    for key in ("training.output_dir", "training.learning_rate", "model.name_or_path", "distributed.timeout_s"):
        assert f"| `{key}` |" in page, key
    # a refused key, with its reason
    assert "| `training.ddp_timeout` | use distributed.timeout_s |" in page
