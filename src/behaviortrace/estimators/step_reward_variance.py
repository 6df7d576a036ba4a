"""Step-level log-only control: the variance of the rewards of the rollout's step. No gradient, no target.

A GRPO step pushes the model only through groups whose rewards differ, so a step whose rewards vary more
tends to have a larger gradient. Where the base reward rarely varies, the variance is high almost only in
steps that paid a bonus: ranking steps by gradient size can then read "this step paid" without attributing
anything. Every rollout of a step gets its step's value; the step score is that value."""

import numpy as np
import polars as pl

USES_TARGET = False
LOG_ONLY = True
STEP_AGGREGATE = "max"


def score(view, target):
    per_step = pl.col("reward").var(ddof=0).over("step")
    return view.rollouts.select(per_step).to_series().to_numpy().astype(np.float64)
