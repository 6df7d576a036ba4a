"""What every rule's script does first: log to the rule's log file, use the cores it was given, and
parse the config sections the rule passed into a typed `Config`."""

from __future__ import annotations

import gc
import logging
import os

from behaviortrace.common.io import setup_logging
from behaviortrace.config.sections import Config

# The line every job logs first; report/cost.py reads the number back (a job's fixed cost: the results page's share).
STARTUP_LINE = "job started %.2f s after its process (interpreter, Snakemake's script preamble, imports)"


def process_age() -> float | None:
    """Seconds since this process began, from Linux's /proc (None elsewhere)."""
    try:
        fields = open("/proc/self/stat").read().rpartition(")")[2].split()
        began = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime: clock ticks after boot
        return float(open("/proc/uptime").read().split()[0]) - began
    except (OSError, ValueError, IndexError):
        return None


def start(snakemake, torch_threads: bool = False) -> Config:
    """Set up a Snakemake job and return the config it was given (`params.config`)."""
    age = process_age()
    # What the job has imported lives as long as the job: kept out of the garbage collector's passes, so that a library
    # that collects often (kronfluence: 12 full passes per fit, 0.4 s each over transformers' objects) does not pay for
    # them every time.
    gc.freeze()
    setup_logging(snakemake.log[0] if snakemake.log else None)
    if age is not None:
        logging.getLogger(__name__).info(STARTUP_LINE, age)
    if torch_threads:
        from behaviortrace.common.device import set_threads

        set_threads(snakemake.threads)
    return Config.from_dict(snakemake.params.config)
