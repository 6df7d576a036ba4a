"""Rule influence_set: f(w_T) retrained with each leave-out replay set of one planted seed removed (as
influence.semantics says)."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.influence import influence_set_job

sm = snakemake  # noqa: F821
influence_set_job(
    start(sm, torch_threads=True),
    seed=int(sm.wildcards.seed),
    sets=[(removal, int(pct)) for removal, pct in sm.params.sets],
    rollouts_path=Path(sm.input.rollouts),
    checkpoints_path=Path(sm.input.checkpoints),
    base_model=Path(sm.input.base_model),
    probes_path=Path(sm.input.probes),
    scores_paths={name: Path(path) for name, path in sm.params.scores.items()},
    outs=[Path(p) for p in sm.output],
)
