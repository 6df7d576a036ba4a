"""Rule prepare: what one estimator computes once per seed for all its score jobs (trak: the Cholesky
factor of its regularized Gram matrix)."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.score import prepare_job

sm = snakemake  # noqa: F821
prepare_job(
    start(sm),
    estimator=sm.wildcards.estimator,
    shards=[Path(p) for p in sm.input.shards],
    rollouts=Path(sm.input.rollouts),
    sketch_matrix=Path(sm.input.matrix),
    sketch_gram=Path(sm.input.gram),
    out=Path(sm.output[0]),
)
