"""Rule sketch_matrix: one seed's sketches stacked into one memory-mappable file for the score jobs."""

from pathlib import Path

from behaviortrace.common.io import setup_logging
from behaviortrace.jobs.sketch import matrix_job

sm = snakemake  # noqa: F821
setup_logging(sm.log[0])
matrix_job(shards=[Path(p) for p in sm.input.shards], out=Path(sm.output[0]))
