"""The fluency control: mean token log-prob of the completion under its generating checkpoint."""

import numpy as np

USES_TARGET = False
STEP_AGGREGATE = "mean"


def score(view, target):
    return view.fluency.astype(np.float64)
