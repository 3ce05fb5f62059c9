"""Rewrites every generated file from the code and the installed trl, peft and transformers, in order:

    python -m posttrain.components.generate

the field table first (components/generated/config_fields.json), then what is built from it: the JSON Schemas
(components/generated/schemas/) and the reference pages (docs/pages/reference/). Tests fail when any drifts.
"""

from posttrain.components.generate import field_table, reference, schema_json

if __name__ == "__main__":
    print(f"wrote {field_table.write()}")
    for path in schema_json.write_all():
        print(f"wrote {path}")
    for path in reference.write_all():
        print(f"wrote {path}")
