"""The templates posttrain ships (the package ``posttrain.templates``, the repository's ``templates/``): a template
by name, and the shipped files its paths name.

``--spec sft/tiny`` names the template ``<algorithm>/<name>.yaml`` where no file of that name is in the
working directory; a path keeps meaning a path. A template names the files it ships with as the repository
does, from the folder that holds ``templates/``: ``templates/data/sft_chat.jsonl``. Read from where posttrain
is installed, those paths name the installed files: relative to the working directory where they lie under it
(a checkout's root: the paths as written), else absolute (an installed package). The job is given them so
(local_cwd, and a cluster that shares the install's file system; a Kubernetes image that holds a checkout
runs from its root, where the paths are as written). Any other relative path (``output_dir``) still starts
where the user runs.
"""

import os
from pathlib import Path
from typing import Any, Optional

import posttrain.templates

TEMPLATES_DIR = Path(posttrain.templates.__file__).resolve().parent
# what a template's paths to its shipped files start from
ROOT = TEMPLATES_DIR.parent
SHIPPED_PREFIX = f"{TEMPLATES_DIR.name}/"


def spec_file(spec: str) -> str:
    """The file ``--spec`` names: the path, where there is one; else the shipped template of that name
    (``sft/tiny``: ``<templates>/sft/tiny.yaml``)."""
    template = TEMPLATES_DIR / f"{spec}.yaml"
    if Path(spec).exists() or not template.is_file():
        return spec
    return str(template)


def is_shipped(path: str) -> bool:
    """Whether a spec file is one of the installed templates."""
    return Path(path).resolve().is_relative_to(TEMPLATES_DIR)


def shipped_paths(raw: Any) -> Any:
    """A shipped template's mapping with each string that names a shipped file or folder
    (``templates/data/sft_chat.jsonl``) naming the installed one, from the working directory."""
    if isinstance(raw, dict):
        return {key: shipped_paths(value) for key, value in raw.items()}
    if isinstance(raw, list):
        return [shipped_paths(value) for value in raw]
    installed = shipped_file(raw)
    return raw if installed is None else path_from(Path.cwd(), installed)


def shipped_file(value: Any) -> Optional[Path]:
    """The installed file or folder a template's value names by its path in the checkout, or None."""
    if isinstance(value, str) and value.startswith(SHIPPED_PREFIX) and (ROOT / value).exists():
        return ROOT / value
    return None


def path_from(folder: Path, path: Path) -> str:
    """``path`` as named from ``folder``: relative where it lies under it, else absolute."""
    relative = os.path.relpath(path.resolve(), folder.resolve())
    return str(path.resolve()) if relative.startswith("..") else relative
