"""Rule influence_set: f(w_T) retrained with one leave-out replay set removed (as influence.semantics says)."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.influence import influence_set_job

sm = snakemake  # noqa: F821
w = sm.wildcards
influence_set_job(
    start(sm, torch_threads=True),
    seed=int(w.seed),
    removal=w.removal,
    pct=int(w.pct),
    rollouts_path=Path(sm.input.rollouts),
    checkpoints_path=Path(sm.input.checkpoints),
    base_model=Path(sm.input.base_model),
    probes_path=Path(sm.input.probes),
    scores_path=Path(sm.input.scores) if sm.input.scores else None,
    out=Path(sm.output[0]),
)
