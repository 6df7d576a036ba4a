"""Rules score and score_target_free: one sketch estimator's scores for one seed, every draw and target kind."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.score import score_job

sm = snakemake  # noqa: F821
score_job(
    start(sm),
    estimator=sm.wildcards.estimator,
    cells=[(int(d), t) for d, t in sm.params.cells],
    shards=[Path(p) for p in sm.input.shards],
    rollouts=Path(sm.input.rollouts),
    sketch_matrix=Path(sm.input.matrix),
    sketch_gram=Path(sm.input.gram) if sm.input.gram else None,
    target_stores=dict(enumerate(Path(p) for p in sm.input.get("targets", []))),  # draws are 0, 1, ...
    out_rollouts=[Path(p) for p in sm.output.rollouts],
    out_steps=[Path(p) for p in sm.output.steps],
)
