"""Rule influence_figure: estimator scores against the exact influence, per planted seed."""

from pathlib import Path

from behaviortrace.common.io import setup_logging
from behaviortrace.influence.stage import influence_figure_job

sm = snakemake  # noqa: F821
setup_logging(sm.log[0])
influence_figure_job(
    seeds=list(sm.params.seeds),
    influence=[Path(p) for p in sm.input.influence],
    rollouts=[Path(p) for p in sm.input.rollouts],
    score_keys=[tuple(k) for k in sm.params.score_keys],
    scores=[Path(p) for p in sm.input.scores],
    out=Path(sm.output[0]),
)
