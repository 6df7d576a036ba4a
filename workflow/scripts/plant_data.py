"""Rule plant_data: training prompts in training order; held-out probe and plain prompts."""

from behaviortrace.common.job import start
from behaviortrace.jobs.plant import plant_data_job

sm = snakemake  # noqa: F821
plant_data_job(start(sm), train=sm.output.train, probes=sm.output.probes, plain=sm.output.plain)
