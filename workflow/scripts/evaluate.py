"""Rule evaluate: every estimator's metrics for one seed and draw, per level and stratum."""

from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.evaluate import evaluate_job

sm = snakemake  # noqa: F821
evaluate_job(
    start(sm),
    seed=int(sm.wildcards.seed),
    draw=int(sm.wildcards.draw),
    shards=[Path(p) for p in sm.input.shards],
    rollouts=Path(sm.input.rollouts),
    token_cosines=Path(sm.input.token_cosines),
    rates=Path(sm.input.rates),
    step_log=Path(sm.input.steps),
    score_files={
        tuple(key.split(":")): (Path(files["rollouts"]), Path(files["steps"]))
        for key, files in sm.params.score_sets.items()
    },
    predicts_change=sm.params.predicts_change,
    out=Path(sm.output[0]),
    cache_dir=Path(sm.params.cache_dir),
)
