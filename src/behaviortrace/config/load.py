"""The run configuration: validated once, then handed to stages as typed sections.

`load`/`parse` validate a whole config (schema, then cross-key checks; every error names its key) and
return a typed `Config`. `subset` is what a rule passes to its job: only the sections it depends on,
so Snakemake's params tracking reruns the job exactly when one of them changes.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from behaviortrace.config.coerce import coerce
from behaviortrace.config.sections import Config
from behaviortrace.config.validate import SCHEMA, validate


def typed_values(raw: dict) -> dict:
    """`raw` with the strings `snakemake --config` hands over read as YAML where the schema wants
    numbers, booleans, lists or mappings (see coerce.py)."""
    return coerce(raw, yaml.safe_load(SCHEMA.read_text()))


def parse(raw: dict) -> Config:
    """Validate a whole config dict and return it typed."""
    return Config.from_dict(validate(raw))


def load(path: str | Path) -> Config:
    return parse(yaml.safe_load(Path(path).read_text()))


def subset(raw: dict, sections: tuple[str, ...], arm: str = "planted") -> dict:
    """The named sections of a validated config dict, for one arm: the placebo arm is the planted
    config with the bonus logged but never paid (`planting.placebo`, which only this function sets)."""
    out = {name: raw[name] for name in sections}
    if "planting" in out:
        out["planting"] = {**out["planting"], "placebo": arm == "placebo"}
    return out
