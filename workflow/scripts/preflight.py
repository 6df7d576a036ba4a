"""Rule preflight: every job that needs the model tried on it before the base model is built. The job gets the
whole config (rule preflight tracks only the sections that rebuild the base model; workflow/rules/model.smk)."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.config.sections import Config
from behaviortrace.jobs.model import preflight_job

sm = snakemake  # noqa: F821
start(sm, torch_threads=True)
preflight_job(Config.from_dict(sm.config), out=Path(sm.output[0]))
