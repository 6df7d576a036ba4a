"""Step-level log-only control: the share of the step's prompt groups with a nonzero advantage. No gradient,
no target.

A group whose rollouts all earned the same reward has advantage 0 everywhere and adds nothing to the step's
gradient, so this share is the step's active part of the batch as the reward log shows it. Every rollout of
a step gets its step's value; the step score is that value."""

import numpy as np
import polars as pl

USES_TARGET = False
LOG_ONLY = True
STEP_AGGREGATE = "max"


def score(view, target):
    active = (pl.col("advantage").abs().max().over("step", "group_id") > 0).cast(pl.Float64)
    first = pl.col("gen_index") == pl.col("gen_index").min().over("step", "group_id")
    share = (active * first).sum().over("step") / pl.col("group_id").n_unique().over("step")
    return view.rollouts.select(share).to_series().to_numpy().astype(np.float64)
