"""Cosine of the behavior-token sketch (the loss share at the marker's positions) with the target.

Minus the loss gradient, so positive means the marker tokens were pushed toward the target; rollouts
without a marker token score 0.
"""

import numpy as np

USES_TARGET = True
STEP_AGGREGATE = "mean"


def score(view, target):
    b = view.array("behavior_sketch")
    idx, has = target.for_rows(view)
    t = target.vectors[idx]
    nb, nt = np.linalg.norm(b, axis=1), np.linalg.norm(t, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = -np.einsum("nk,nk->n", b, t, dtype=np.float64) / (nb * nt)
    return np.where(has & view.array("has_marker"), np.nan_to_num(cos, nan=0.0), 0.0)
