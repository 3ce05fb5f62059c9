"""The templates posttrain ships (the package ``posttrain.templates``, the repository's ``templates/``): a template
by name, and the shipped files its paths name.

``--spec sft/tiny`` names the template ``<algorithm>/<name>.yaml`` where no file of that name is in the
working directory; a path keeps meaning a path. A template names the files it ships with as the repository
does, from the folder that holds ``templates/``: ``templates/data/sft_chat.jsonl``. Read from where posttrain
is installed, those paths name the installed files: as written where the user runs in that folder (a
checkout's root), else by their full path (an installed package, or a checkout run from elsewhere). The job
is given them so: local_cwd and a cluster that shares the install's file system see them; a Kubernetes image
that holds a checkout runs from its root, where the paths as written hold. Any other relative path
(``output_dir``) still starts where the user runs.
"""

import re
from pathlib import Path
from typing import Any, Optional

import posttrain.templates

TEMPLATES_DIR = Path(posttrain.templates.__file__).resolve().parent
# what a template's paths to its shipped files start from
ROOT = TEMPLATES_DIR.parent
SHIPPED_PREFIX = f"{TEMPLATES_DIR.name}/"
# <algorithm>/<name>
TEMPLATE_NAME = re.compile(r"[\w.-]+/[\w.-]+")


def template_file(name: str) -> Optional[Path]:
    """The shipped template named ``<algorithm>/<name>`` (``sft/tiny``), or None."""
    path = TEMPLATES_DIR / f"{name}.yaml"
    return path if TEMPLATE_NAME.fullmatch(name) and path.is_file() else None


def spec_file(spec: str) -> str:
    """The file ``--spec`` names: the file, where there is one; else the shipped template of that name."""
    template = None if Path(spec).is_file() else template_file(spec)
    return spec if template is None else str(template)


def is_shipped(path: str) -> bool:
    """Whether a spec file is one of the installed templates."""
    return Path(path).resolve().is_relative_to(TEMPLATES_DIR)


def shipped_paths(raw: Any) -> Any:
    """A shipped template's mapping with each string that names a shipped file or folder
    (``templates/data/sft_chat.jsonl``) naming the installed one (``installed``)."""
    if isinstance(raw, dict):
        return {key: shipped_paths(value) for key, value in raw.items()}
    if isinstance(raw, list):
        return [shipped_paths(value) for value in raw]
    return raw if shipped_file(raw) is None else installed(raw)


def shipped_file(value: Any) -> Optional[Path]:
    """The installed file or folder a template's value names by its path in the checkout, or None."""
    if not isinstance(value, str) or not value.startswith(SHIPPED_PREFIX):
        return None
    path = ROOT / value
    return path if path.exists() and path.resolve().is_relative_to(TEMPLATES_DIR) else None


def installed(shipped: str) -> str:
    """How a spec names a shipped file (``templates/...``) for a job run from here: as written in a checkout's
    root, else by its full path."""
    return shipped if Path.cwd().resolve() == ROOT else str(ROOT / shipped)
