"""What every rule's script does first: log to the rule's log file, use the cores it was given, and
parse the config sections the rule passed into a typed `Config`."""

from __future__ import annotations

from behaviortrace.common.io import setup_logging
from behaviortrace.config.sections import Config


def start(snakemake, torch_threads: bool = False) -> Config:
    """Set up a Snakemake job and return the config it was given (`params.config`)."""
    setup_logging(snakemake.log[0] if snakemake.log else None)
    if torch_threads:
        from behaviortrace.common.device import set_threads

        set_threads(snakemake.threads)
    return Config.from_dict(snakemake.params.config)
