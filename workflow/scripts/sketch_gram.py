"""Rule sketch_gram: the Gram matrix of one seed's stacked sketches, for the estimators that prepare."""

from pathlib import Path

from behaviortrace.common.io import setup_logging
from behaviortrace.jobs.sketch import gram_job

sm = snakemake  # noqa: F821
setup_logging(sm.log[0])
gram_job(matrix=Path(sm.input.matrix), out=Path(sm.output[0]))
