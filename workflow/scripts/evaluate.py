"""Rule evaluate: every estimator's metrics for one seed and draw, per level and stratum."""

from pathlib import Path

from behaviortrace.evalstage import evaluate_job
from behaviortrace.io import setup_logging

sm = snakemake  # noqa: F821
setup_logging(sm.log[0])
w, p = sm.wildcards, sm.params
out_dir = Path(sm.output[0]).parents[1] / "scores"
files = {(e, t): (out_dir / e / f"draw{w.draw}_{t}.parquet", out_dir / e / f"draw{w.draw}_{t}_steps.parquet")
         for e, t in p.score_keys}
evaluate_job(run=p.run, seed=int(w.seed), draw=int(w.draw), shards=[Path(s) for s in sm.input.shards],
             rollouts=Path(sm.input.rollouts), target_store=Path(sm.input.target), rates=Path(sm.input.rates),
             score_files=files, window=p.window, saturation=p.saturation, evaluation=p.evaluation,
             out=Path(sm.output[0]), placebo=p.placebo)
