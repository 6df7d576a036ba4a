"""The run configuration: every key defined once (sections.py), the schema made from it (schema.py), defaults and
loading (load.py), rules across keys (rules.py), the reference page (reference.py) and `--config` typing (coerce.py)."""
