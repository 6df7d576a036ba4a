"""A config file or `--config` values, completed with the defaults and typed.

A config holds only what differs from the defaults (`sections.py`); `complete` fills in the rest, so every job
still gets whole sections. `subset` is what a rule passes to its job: only the sections it depends on, so
Snakemake's params tracking reruns the job exactly when one of them changes. Validation, which needs every
stage's rules, is `behaviortrace.configure`.
"""

from __future__ import annotations

import copy
from dataclasses import MISSING

from behaviortrace.config.coerce import coerce
from behaviortrace.config.schema import SCHEMA
from behaviortrace.config.sections import SECTIONS, Config, From, user_fields


def _default(f):
    return f.default_factory() if f.default is MISSING else copy.deepcopy(f.default)


def _complete(cls: type, given) -> dict:
    """`given` over the defaults of section `cls`, nested sections key by key; keys the section does not have
    are kept, for the schema to name them."""
    if not isinstance(given, dict):
        return given
    out = {}
    for f in user_fields(cls):
        nested = SECTIONS.get(f.type) or (Config if f.type == "Config" else None)
        if nested is not None:
            out[f.name] = _complete(nested, given.get(f.name, {}))
        elif f.metadata.get("instances") and isinstance(given.get(f.name), dict):
            # The config's own order first (it orders tables and jobs), then the defaults it leaves out.
            merged = {**given[f.name], **{k: v for k, v in _default(f).items() if k not in given[f.name]}}
            out[f.name] = {name: entry for name, entry in merged.items() if entry is not None}
        else:
            out[f.name] = given[f.name] if f.name in given else _default(f)
    return {**out, **{name: value for name, value in given.items() if name not in out}}


def _lookup(raw: dict, path: str):
    for part in path.split("."):
        raw = raw[part]
    return raw


def _derive(raw: dict, node: dict | None = None) -> None:
    """Replace every `From` default by a copy of the key it names."""
    node = raw if node is None else node
    for name, value in node.items():
        if isinstance(value, dict):
            _derive(raw, value)
        elif isinstance(value, From):
            node[name] = copy.deepcopy(_lookup(raw, value.path))


def complete(raw: dict) -> dict:
    """A whole config: `raw` with every key it leaves out set to its default. Sections merge key by key;
    `estimators` merges instance by instance (an entry given replaces the default one; null removes it)."""
    out = _complete(Config, raw)
    _derive(out)
    return out


def defaults() -> dict:
    """The default config, whole (the built-in tiny model on a CPU)."""
    return complete({})


def typed_values(raw: dict) -> dict:
    """`raw` with the strings `snakemake --config` hands over read as YAML where the schema wants
    numbers, booleans, lists or mappings (see coerce.py)."""
    return coerce(raw, SCHEMA)


def subset(raw: dict, sections: tuple[str, ...], arm: str = "planted") -> dict:
    """The named sections of a validated config dict, for one arm: the placebo arm is the planted
    config with the bonus logged but never paid (`planting.placebo`, which only this function sets)."""
    out = {name: raw[name] for name in sections}
    if "planting" in out:
        out["planting"] = {**out["planting"], "placebo": arm == "placebo"}
    return out
