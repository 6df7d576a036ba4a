"""Rule replay: retrain one seed with one set of rollouts left out; behavior at the window's end and last step."""

from pathlib import Path

import polars as pl

from behaviortrace import device
from behaviortrace.io import setup_logging
from behaviortrace.replay import replay_job

sm = snakemake  # noqa: F821
setup_logging(sm.log[0])
device.set_threads(sm.threads)
w, p = sm.wildcards, sm.params
replay_job(seed=int(w.seed), method=w.method, pct=int(w.pct), rep=int(w.rep), rollouts_path=Path(sm.input.rollouts),
           checkpoints_path=Path(sm.input.checkpoints), base_model=Path(sm.input.base_model),
           scores_path=Path(sm.input.scores) if sm.input.scores else None,
           probes=pl.read_parquet(sm.input.probes), controls=pl.read_parquet(sm.input.controls), grpo=p.grpo,
           window=p.window, replay=p.replay, targets=p.targets, sampling=p.sampling, marker=p.marker,
           base_reward=p.base_reward, device=device.resolve(p.compute), out=Path(sm.output[0]))
