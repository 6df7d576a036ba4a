"""Per step, side by side: what the step measurably did to the behavior (train/effect.py), how many
labeled rollouts it trained on, and each estimator's step score; the table behind the effect figure."""

from __future__ import annotations

from pathlib import Path

import polars as pl


def effect_steps_table(
    runs: list[tuple[int, Path, Path]], step_scores: dict[tuple[int, str, str], Path], draw: int
) -> pl.DataFrame:
    """One row per seed, step and score set: the measured change and the step's labels beside the score.

    `runs`: (seed, step log, rollout log) of each planted seed; `step_scores`: (seed, estimator, target) ->
    that estimator's step scores of generation draw `draw`.
    """
    frames = []
    for seed, step_log, rollouts in runs:
        labels = (
            pl.scan_parquet(rollouts)
            .group_by("step")
            .agg(
                n_paid=pl.col("paid").sum(),
                n_behavior=pl.col("behavior").sum(),
                n_rollouts=pl.len(),
            )
            .collect()
        )
        steps = (
            pl.read_parquet(step_log)
            .select("step", "target_logprob", "target_change", "lr", "clip_coef")
            .join(labels, on="step", how="left")
        )
        for (s, estimator, target), path in step_scores.items():
            if s != seed:
                continue
            scores = pl.read_parquet(path).select("step", "score")
            key = pl.DataFrame({"seed": [seed], "draw": [draw], "estimator": [estimator], "target": [target]})
            frames.append(key.join(steps.join(scores, on="step", how="left"), how="cross"))
    return pl.concat(frames, how="vertical").sort("seed", "draw", "estimator", "target", "step")
