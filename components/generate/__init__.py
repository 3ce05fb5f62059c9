"""What writes the generated files (components/generated/: the field table and the JSON Schemas;
docs/pages/reference/): ``python -m posttrain.components.generate`` rewrites them all."""
