"""Rule base_model: build the tiny model or load a real one, run the optional SFT warm-up, save it."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.model import base_model_job

sm = snakemake  # noqa: F821
base_model_job(start(sm, torch_threads=True), out=Path(sm.output[0]))
