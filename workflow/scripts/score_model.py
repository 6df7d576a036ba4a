"""Rule score_model: one model-needing estimator's scores for one seed, draw and target kind."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.score.stage import score_model_job

sm = snakemake  # noqa: F821
w = sm.wildcards
score_model_job(
    start(sm, torch_threads=True),
    estimator=w.estimator,
    target=w.target,
    draw=int(w.draw),
    rollouts=Path(sm.input.rollouts),
    checkpoints=Path(sm.input.checkpoints),
    base_model=Path(sm.input.base_model),
    prepared=Path(sm.input.prepared) if sm.input.prepared else None,
    target_store=Path(sm.input.target) if sm.input.target else None,
    probes=Path(sm.input.probes),
    out_rollouts=Path(sm.output.rollouts),
    out_steps=Path(sm.output.steps),
)
