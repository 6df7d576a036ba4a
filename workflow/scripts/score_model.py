"""Rule score_model: one model-needing estimator's per-seed fit and its scores for one seed, every draw and target
kind."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.score import score_model_job

sm = snakemake  # noqa: F821
score_model_job(
    start(sm, torch_threads=True),
    estimator=sm.wildcards.estimator,
    cells=[(int(d), t) for d, t in sm.params.cells],
    rollouts=Path(sm.input.rollouts),
    checkpoints=Path(sm.input.checkpoints),
    base_model=Path(sm.input.base_model),
    target_stores=dict(enumerate(Path(p) for p in sm.input.targets)),  # draws are 0, 1, ...
    probes=Path(sm.input.probes),
    out_rollouts=[Path(p) for p in sm.output.rollouts],
    out_steps=[Path(p) for p in sm.output.steps],
)
