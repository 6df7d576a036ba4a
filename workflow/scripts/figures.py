"""Rule figures: the run's PNG figures from the aggregated metrics and the behavior rates."""

from pathlib import Path

import polars as pl

from behaviortrace.figures import write_figures
from behaviortrace.io import setup_logging

sm = snakemake  # noqa: F821
log = setup_logging(sm.log[0])
behavior = [(arm, pl.read_parquet(path)) for arm, path in zip(sm.params.arms, sm.input.behavior)]
write_figures(pl.read_parquet(sm.input.metrics), behavior, pl.read_parquet(sm.input.replay), sm.params.window,
              sm.params.checklist["target"], {k: Path(v) for k, v in sm.output.items()})
log.info("%d figures written", len(sm.output))
