"""Log-only control: 1 where the completion shows the planted behavior, else 0. No gradient, no target.

Every paid rollout shows the behavior, so this control separates the paid rollouts from rollouts that
do not; it is blind to who among the behavior-showing rollouts was paid (the behavior-matched metrics). At
step level its sum counts a step's behavior-showing rollouts."""

import numpy as np

USES_TARGET = False
LOG_ONLY = True
STEP_AGGREGATE = "sum"


def score(view, target):
    return view.rollouts["behavior"].to_numpy().astype(np.float64)
