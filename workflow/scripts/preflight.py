"""Rule preflight: every job that needs the model tried on it before the base model is built."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.model.stage import preflight_job

sm = snakemake  # noqa: F821
preflight_job(start(sm, torch_threads=True), out=Path(sm.output[0]))
