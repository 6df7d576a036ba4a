"""A run's configuration, read and checked: defaults filled in, the schema, then every cross-key rule.

The rules live with what they know about (the config's own in `config/rules.py`, the task's words in
`plant/task.py`, TRL's losses in `train/trl_surface.py`, ...); this module, above every stage, only lists
them. Everything here runs when the Snakefile is parsed, before any job starts, and every error names the
config key and its value.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from behaviortrace.config import rules
from behaviortrace.config.load import complete, typed_values
from behaviortrace.config.schema import ConfigError, check_schema
from behaviortrace.config.sections import Config
from behaviortrace.model import lora, vocab
from behaviortrace.plant import task
from behaviortrace.score import contract
from behaviortrace.sketch import tolerance
from behaviortrace.train import checkpoints, trl_surface

RULES = (
    rules.problems,
    task.config_problems,
    vocab.config_problems,
    lora.config_problems,
    trl_surface.config_problems,
    checkpoints.config_problems,
    tolerance.config_problems,
    contract.config_problems,
)


def validate(raw: dict) -> dict:
    """`raw` completed with the defaults and checked; raises a ConfigError listing every problem."""
    whole = complete(raw)
    check_schema(whole)
    cfg = Config.from_dict(whole)
    problems = [problem for rule in RULES for problem in rule(cfg)]
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    return whole


def parse(raw: dict) -> Config:
    """Validate a config dict (whole or only what differs from the defaults) and return it typed."""
    return Config.from_dict(validate(raw))


def load(path: str | Path) -> Config:
    """A config file, typed as the workflow types it (`1e9` is a number) and checked."""
    return parse(typed_values(yaml.safe_load(Path(path).read_text()) or {}))
