"""What every rule's script does first: log to the rule's log file, use the cores it was given, and
parse the config sections the rule passed into a typed `Config`."""

from __future__ import annotations

import gc

from behaviortrace.common.io import setup_logging
from behaviortrace.config.sections import Config


def start(snakemake, torch_threads: bool = False) -> Config:
    """Set up a Snakemake job and return the config it was given (`params.config`)."""
    # What the job has imported lives as long as the job: kept out of the garbage collector's passes, so that a library
    # that collects often (kronfluence: 12 full passes per fit, 0.4 s each over transformers' objects) does not pay for
    # them every time.
    gc.freeze()
    setup_logging(snakemake.log[0] if snakemake.log else None)
    if torch_threads:
        from behaviortrace.common.device import set_threads

        set_threads(snakemake.threads)
    return Config.from_dict(snakemake.params.config)
