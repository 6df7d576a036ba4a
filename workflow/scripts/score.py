"""Rule score: one estimator's scores for one seed, draw and target kind."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.score import score_job

sm = snakemake  # noqa: F821
w = sm.wildcards
score_job(
    start(sm),
    estimator=w.estimator,
    target=w.target,
    draw=int(w.draw),
    shards=[Path(p) for p in sm.input.shards],
    rollouts=Path(sm.input.rollouts),
    sketch_matrix=Path(sm.input.matrix),
    prepared=Path(sm.input.prepared) if sm.input.prepared else None,
    target_store=Path(sm.input.target) if sm.input.target else None,
    out_rollouts=Path(sm.output.rollouts),
    out_steps=Path(sm.output.steps),
)
