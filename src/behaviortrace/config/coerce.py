"""Values given with `snakemake --config` typed the way users expect.

Snakemake reads `--config key=value` with YAML's base loader, so every value inside a list or mapping
arrives as a string (`seeds=[0]` gives ['0']). Before validation, each string is read again as YAML
reads a config file, wherever the schema does not accept it as a string: `'0'` becomes 0 where an
integer is wanted, while `run: '007'` or a trigger word stay strings. Where the schema says nothing
(an estimator's own parameters), strings are read as YAML too, as they would be in the config file.

YAML 1.1 (PyYAML, Snakemake's loader) reads `1e9` and `1e-3` as strings (it wants `1.0e+9`); where the
schema wants a number, they are read as the numbers their writers meant.
"""

from __future__ import annotations

import re

import jsonschema
import yaml

EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _accepts(schema: dict, value) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def coerce(value, schema: dict):
    """`value` with strings that the schema rejects (or does not describe) read as YAML scalars,
    lists and mappings; nothing else changes."""
    if isinstance(value, str):
        if schema and _accepts(schema, value):
            return value
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            return value
        if isinstance(parsed, str) and EXPONENT.fullmatch(value.strip()) and _accepts(schema, float(value)):
            return float(value)
        return value if isinstance(parsed, str) or parsed is None else coerce(parsed, schema)
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        fallback = extra if isinstance(extra, dict) else {}
        return {key: coerce(item, properties.get(key, fallback)) for key, item in value.items()}
    if isinstance(value, list):
        items = schema.get("items", {})
        return [coerce(item, items) for item in value]
    return value
