"""Rule score: one estimator's scores for one seed, draw and target kind."""

from pathlib import Path

from behaviortrace.evalstage import score_job
from behaviortrace.io import setup_logging

sm = snakemake  # noqa: F821
setup_logging(sm.log[0])
w = sm.wildcards
score_job(estimator=w.estimator, params=sm.params.estimator, target=w.target, draw=int(w.draw),
          shards=[Path(p) for p in sm.input.shards], rollouts=Path(sm.input.rollouts),
          target_store=Path(sm.input.target) if w.target != "none" else None,
          out_rollouts=Path(sm.output.rollouts), out_steps=Path(sm.output.steps))
