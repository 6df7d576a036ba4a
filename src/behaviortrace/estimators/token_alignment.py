"""Cosine of the behavior-token sketch (the loss share at the marker's positions) with the target.

Minus the loss gradient, so positive means the marker tokens were pushed toward the target; rollouts
without a marker token score 0.
"""

import numpy as np

from behaviortrace.common.vectors import target_cosine

USES_TARGET = True
STEP_AGGREGATE = "mean"


def score(view, target):
    idx, has = target.for_rows(view)
    cos = -target_cosine(view.array("behavior_sketch"), target, idx)
    return np.where(has & view.array("has_marker"), cos, 0.0)
