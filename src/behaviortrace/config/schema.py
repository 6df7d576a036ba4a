"""The validation schema (JSON Schema), produced from the key definitions in `sections.py`."""

from __future__ import annotations

import typing

import jsonschema

from behaviortrace.config.sections import SECTIONS, Config, user_fields

_SCALARS = {
    "bool": {"type": "boolean"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "str": {"type": "string"},
}


class ConfigError(ValueError):
    pass


def _of_type(tp) -> dict:
    """The schema an annotation states by itself."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin is list:
        return {"type": "array", "items": _of_type(typing.get_args(tp)[0])}
    if isinstance(tp, type) and tp.__name__ in SECTIONS:
        return of_section(tp)
    return dict(_SCALARS[tp.__name__])


def _of_field(cls: type, f) -> dict:
    meta = f.metadata
    if meta.get("schema"):
        return meta["schema"]
    out = _of_type(typing.get_type_hints(cls)[f.name])
    out.update(meta.get("bounds", {}))
    if meta.get("items"):
        out["items"] = {**out["items"], **meta["items"]}
    return out


def of_section(cls: type) -> dict:
    """The schema of a section class: its keys, each with its type and bounds, and no others."""
    keys = user_fields(cls)
    return {
        "type": "object",
        "additionalProperties": False,
        "required": [f.name for f in keys],
        "properties": {f.name: _of_field(cls, f) for f in keys},
    }


SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "description": "BehaviorTrace run configuration (docs/config.md lists every key)",
    **of_section(Config),
}


def _key(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def check_schema(config: dict) -> None:
    """Raise a ConfigError naming every key whose value the schema rejects."""
    errors = sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for e in errors:
            if e.validator == "additionalProperties":
                lines.append(f"config key {_key(e.absolute_path)}: {e.message}")
            else:
                lines.append(f"config key {_key(e.absolute_path)} = {e.instance!r}: {e.message}")
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines))
