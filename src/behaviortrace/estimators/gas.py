"""GAS, renormalized TracInCP (Hammoudeh & Lowd, CCS 2022): both vectors unit-normalized, weighted by
the learning rate; minus the cosine, as in tracincp, so positive means the update raised the target."""

import numpy as np

from behaviortrace.common.vectors import step_sums, target_cosine

USES_TARGET = True
STEP_AGGREGATE = "sum"


def score(view, target):
    idx, has = target.for_rows(view)
    lr = view.rollouts["lr"].to_numpy()
    return np.where(has, -lr * target_cosine(view.sketches, target, idx), 0.0)


def step_score(view, target):
    """Cosine of the step's summed gradient sketch with the target, times the learning rate."""
    sums, first = step_sums(view, view.sketches)
    idx, has = target.for_rows(view)
    lr = view.rollouts["lr"].to_numpy()[first]
    return np.where(has[first], -lr * target_cosine(sums, target, idx[first]), 0.0)
