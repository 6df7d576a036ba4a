"""Step-level log-only control: 1 where the rollout's step paid a bonus to any rollout, else 0. No gradient,
no target.

Ranking steps by the planted label needs no attribution at all when whether a step paid is in the log;
a step-level metric that this control matches tells the reader nothing the reward log does not. Every
rollout of a step gets its step's value; the step score is that value."""

import numpy as np
import polars as pl

USES_TARGET = False
LOG_ONLY = True
STEP_AGGREGATE = "max"


def score(view, target):
    paid = pl.col("paid").any().over("step").cast(pl.Float64)
    return view.rollouts.select(paid).to_series().to_numpy().astype(np.float64)
