"""What every rule's script does first: log to the rule's log file, use the cores it was given, and
parse the config sections the rule passed into a typed `Config`."""

from __future__ import annotations

import gc
import importlib
import logging
import sys

from behaviortrace.common.io import setup_logging
from behaviortrace.config.sections import Config

# What a job that runs the model imports, before the garbage collector's baseline is set (`settle`).
MODEL_LIBRARIES = ("torch", "transformers.modeling_utils")


def start(snakemake, torch_threads: bool = False) -> Config:
    """Set up a Snakemake job and return the config it was given (`params.config`). A job that runs the model
    (`torch_threads`) imports torch and transformers here, before `settle`."""
    setup_logging(snakemake.log[0] if snakemake.log else None)
    if torch_threads:
        from behaviortrace.common.device import set_threads

        set_threads(snakemake.threads)
    settle(*(MODEL_LIBRARIES if torch_threads else ()))
    return Config.from_dict(snakemake.params.config)


def settle(*libraries: str) -> None:
    """Import `libraries`, then keep everything imported so far out of the garbage collector's passes: it lives as long
    as the job. A library that collects often (kronfluence calls gc.collect twice per checkpoint and cell: 0.25 s each
    over transformers' objects, most of an ekfac score job on the built-in model) then pays for its own objects only.
    Called again after a later import, it settles that one too."""
    for name in libraries:
        import_keeping_logs(name)
    gc.freeze()


def import_keeping_logs(name: str) -> None:
    """Import `name` without letting it call logging.basicConfig (bergson calls it with force=True, which would close
    the job's log file handler and send every later record, errors included, to the console instead)."""
    if name in sys.modules:
        return
    configure = logging.basicConfig
    logging.basicConfig = lambda **kwargs: None
    try:
        importlib.import_module(name)
    finally:
        logging.basicConfig = configure
