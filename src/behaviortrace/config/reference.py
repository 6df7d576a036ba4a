"""The config reference page, `docs/config.md`, generated from the key definitions (`sections.py`).

`make docs` (`python -m behaviortrace.config.reference > docs/config.md`) rewrites it; a test fails when the
page and the definitions differ.
"""

from __future__ import annotations

import json

import yaml

from behaviortrace.config.load import defaults
from behaviortrace.config.schema import SCHEMA
from behaviortrace.config.sections import SECTIONS, Config, From, user_fields

HEADER = """# Config reference

Generated from the key definitions in `src/behaviortrace/config/sections.py` by `make docs`; do not edit
by hand. These defaults are the default run's values: `config/config.yaml` names the run and nothing else. Every
config file, a preset in `config/` or your own, is these defaults plus itself, and `--config` values apply on top
([config/README.md](../config/README.md)); a run writes the whole config it ran with to
`results/{run}/config.yaml`. Rules across keys (a window that ends past the last step, a target
kind that is not evaluated, an estimator argument its score function does not take, a hub model missing from
the local cache, ...) are checked with the schema, before any job starts."""

_LIMITS = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"))


def accepts(schema: dict) -> str:
    """What a key's schema accepts, in a few words."""
    if "enum" in schema:
        return ", ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    if "oneOf" in schema:
        return " or ".join(accepts(s) for s in schema["oneOf"])
    if schema.get("type") == "array":
        if schema.get("minItems") is not None and schema.get("minItems") == schema.get("maxItems"):
            size = f" of {schema['minItems']}"
        else:
            size = f" (at least {schema['minItems']})" if schema.get("minItems") else ""
        unique = ", distinct" if schema.get("uniqueItems") else ""
        return f"list{size}{unique}: {accepts(schema.get('items', {}))}"
    words = [schema.get("type", "mapping")]
    words += [f"{sign} {schema[name]}" for name, sign in _LIMITS if name in schema]
    if "pattern" in schema:
        words.append(f"matching `{schema['pattern']}`")
    return " ".join(words)


def _section(cls: type, path: str, schema: dict, values: dict) -> list[str]:
    """The section's table, then its nested sections'."""
    doc = " ".join(cls.__doc__.split()) if path else "The run's name, its seeds and the estimator instances."
    rows = [
        f"## `{path}`" if path else "## Top level",
        "",
        doc,
        "",
        "| key | default | accepts | what |",
        "|---|---|---|---|",
    ]
    nested = []
    for f in user_fields(cls):
        name = f"{path}.{f.name}" if path else f.name
        if f.type in SECTIONS:
            nested.append((SECTIONS[f.type], name, schema["properties"][f.name], values[f.name]))
            continue
        default = f.default if isinstance(f.default, From) else values[f.name]
        shown = f"same as `{default.path}`" if isinstance(default, From) else f"`{json.dumps(default)}`"
        if f.name == "estimators":
            shown = "below"
        rows.append(f"| `{name}` | {shown} | {accepts(schema['properties'][f.name])} | {f.metadata['doc']} |")
    out = [*rows, ""]
    if not path:
        out += ["The default estimator instances ([estimators.md](estimators.md) says what each one is):", ""]
        out += ["```yaml", yaml.safe_dump({"estimators": values["estimators"]}, sort_keys=False).strip(), "```", ""]
    for sub in nested:
        out += _section(*sub)
    return out


def markdown() -> str:
    """The whole reference page."""
    return "\n".join([HEADER, "", *_section(Config, "", SCHEMA, defaults())]).rstrip() + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
