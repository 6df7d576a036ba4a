"""Rule results_page: the run's results on one Markdown page, from its own tables."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.report import results_page_job

sm = snakemake  # noqa: F821
results_page_job(
    start(sm),
    inputs={name: Path(path) for name, path in sm.input.items()},
    benchmarks=Path(sm.params.benchmarks),
    estimators=set(sm.params.estimators),
    outputs={name: Path(path) for name, path in sm.output.items()},
)
