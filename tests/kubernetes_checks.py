"""Offline checks of Kubernetes requests: a Volcano Job against the schema the project ships, each pod template
against Kubernetes' OpenAPI schemas (kubernetes-validate, strict), and its resource quantities."""

import json
import re
from typing import Any, Dict, List

import jsonschema
import kubernetes_validate

from helpers import REPO

KUBERNETES_VERSION = "1.30"
VOLCANO_SCHEMA = json.loads((REPO / "schedulers_config" / "volcano-job.schema.json").read_text())
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")


def pods(job: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "Pod", "metadata": task["template"]["metadata"], "spec": task["template"]["spec"]}
        for task in job["spec"]["tasks"]
    ]


def resource_problems(pod: Dict[str, Any]) -> List[str]:
    """What the schemas cannot see: quantities must be well-formed, and limits positive."""
    found = []
    for container in pod["spec"]["containers"]:
        for kind in ("limits", "requests"):
            for name, value in container.get("resources", {}).get(kind, {}).items():
                match = _QUANTITY.match(str(value))
                if match is None:
                    found.append(f"{container['name']}.{kind}.{name}: not a quantity: {value!r}")
                elif kind == "limits" and float(match.group(1)) <= 0:
                    found.append(f"{container['name']}.{kind}.{name}: must be positive: {value!r}")
    return found


def check(job: Dict[str, Any]) -> None:
    jsonschema.validate(job, VOLCANO_SCHEMA)
    for pod in pods(job):
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
        assert resource_problems(pod) == []
