"""Rule targets: in-context and forced behavior targets and behavior rates for one seed and draw."""

from pathlib import Path

import polars as pl

from behaviortrace import device
from behaviortrace.io import setup_logging
from behaviortrace.targetstage import build_targets

sm = snakemake  # noqa: F821
setup_logging(sm.log[0])
device.set_threads(sm.threads)
p = sm.params
build_targets(seed=int(sm.wildcards.seed), draw=int(sm.wildcards.draw), checkpoints_path=Path(sm.input.checkpoints),
              probes=pl.read_parquet(sm.input.probes), controls=pl.read_parquet(sm.input.controls),
              out_store=Path(sm.output.store), out_rates=Path(sm.output.rates), targets=p.targets, sketch=p.sketch,
              sampling=p.sampling, marker=p.marker, base_reward=p.base_reward, model_name=p.model_name,
              device=device.resolve(p.compute))
