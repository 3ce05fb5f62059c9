"""The spec, shared by the client and the job: what a spec may hold and how it is read and checked.

``schema`` (the sections every spec shares), ``registry`` (one spec class per
algorithm: its TRL config, data formats, extra models, the keys it refuses),
``fields`` and ``values`` with their tables (``config_fields.json``,
``value_rules/``: every ``training`` key's types and ranges), ``overrides``
(``key.path=value``), ``messages`` (``SpecError`` and the wording of
problems), ``loading`` (a YAML file or the embedded JSON to a validated
spec), and the checks of local files and data sources both sides run
(``local_files``, ``data_sources``) and the built-in rewards (``rewards``).

It imports no torchx, torch, trl or transformers: the component validates a
spec before anything is scheduled, and the job, which imports nothing else
from ``components/``, validates it again before loading a model.
"""

# the library's loading API
from posttrain.components.spec.loading import load_spec, spec_from_json, validate

__all__ = ["load_spec", "spec_from_json", "validate"]
