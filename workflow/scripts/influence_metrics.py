"""Rule influence_metrics: how well every estimator, control and the label track the exact influence."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.influence.table import SEED_FILES
from behaviortrace.jobs.influence import influence_metrics_job

sm = snakemake  # noqa: F821
influence_metrics_job(
    start(sm),
    seeds=list(zip(sm.params.arms, sm.params.seeds, strict=True)),
    files={kind: [Path(p) for p in sm.input[kind]] for kind in SEED_FILES},
    score_keys=[tuple(k) for k in sm.params.score_keys],
    scores=[Path(p) for p in sm.input.scores],
    step_scores=[Path(p) for p in sm.input.step_scores],
    set_seeds=list(sm.params.set_seeds),
    set_files=[Path(p) for p in sm.input.sets],
    out=Path(sm.output.table),
    csv=Path(sm.output.csv),
    top=Path(sm.output.top),
    markdown=Path(sm.output.markdown),
    html=Path(sm.output.html),
    log_only=tuple(sm.params.log_only),
)
