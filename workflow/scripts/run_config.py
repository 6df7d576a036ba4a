"""Rule run_config: the whole config the run ran with, and the package version and commit (config/record.py)."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.config import record

sm = snakemake  # noqa: F821
start(sm)
record.write(dict(sm.params.config), Path(sm.output[0]))
