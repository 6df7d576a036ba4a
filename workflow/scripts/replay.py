"""Rule replay: retrain one seed with one set of rollouts left out, and with each random set step-matched to it."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.replay import replay_job

sm = snakemake  # noqa: F821
w = sm.wildcards
replay_job(
    start(sm, torch_threads=True),
    seed=int(w.seed),
    removal=w.removal,
    pct=int(w.pct),
    rollouts_path=Path(sm.input.rollouts),
    checkpoints_path=Path(sm.input.checkpoints),
    base_model=Path(sm.input.base_model),
    scores_path=Path(sm.input.scores) if sm.input.scores else None,
    probes_path=Path(sm.input.probes),
    plain_path=Path(sm.input.plain),
    out=Path(sm.output[0]),
    semantics=sm.params.semantics,
)
