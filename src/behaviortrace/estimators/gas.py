"""GAS, renormalized TracInCP (Hammoudeh & Lowd, CCS 2022): both vectors unit-normalized, weighted by
the learning rate; minus the cosine, as in tracincp, so positive means the update raised the target."""

import numpy as np

from . import step_sums

USES_TARGET = True
STEP_AGGREGATE = "sum"


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.einsum("nk,nk->n", a, b, dtype=np.float64) / (na * nb)
    return np.nan_to_num(cos, nan=0.0)


def score(view, target):
    idx, has = target.for_rows(view)
    lr = view.rollouts["lr"].to_numpy()
    return np.where(has, -lr * _cosine(view.sketches, target.vectors[idx]), 0.0)


def step_score(view, target):
    """Cosine of the step's summed gradient sketch with the target, times the learning rate."""
    sums, first = step_sums(view, view.sketches.astype(np.float64))
    idx, has = target.for_rows(view)
    lr = view.rollouts["lr"].to_numpy()[first]
    return np.where(has[first], -lr * _cosine(sums, target.vectors[idx[first]].astype(np.float64)), 0.0)
