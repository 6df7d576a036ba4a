"""Rule influence: every rollout's exact influence on f(w_T) for one arm and seed, with the job's own checks."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.influence import influence_job

sm = snakemake  # noqa: F821
influence_job(
    start(sm, torch_threads=True),
    arm=sm.wildcards.arm,
    seed=int(sm.wildcards.seed),
    rollouts_path=Path(sm.input.rollouts),
    steps_path=Path(sm.input.steps),
    checkpoints_path=Path(sm.input.checkpoints),
    base_model=Path(sm.input.base_model),
    probes_path=Path(sm.input.probes),
    out_rollouts=Path(sm.output.rollouts),
    out_steps=Path(sm.output.steps),
    out_checks=Path(sm.output.checks),
    out_retrain=Path(sm.output.retrain),
    out_summary=Path(sm.output.summary),
    label_percents=tuple(sm.params.label_percents),
    replay_seed=sm.params.replay_seed,
)
