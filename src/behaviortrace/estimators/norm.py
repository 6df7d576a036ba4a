"""The magnitude control: the exact L2 norm of the rollout's gradient, no target.

Its step-level variant is the sketched norm of the step's summed (pre-clip) gradient: a step ranked by
how hard it pushed, which is what the paper's norm-only control measured.
"""

import numpy as np

from behaviortrace.common.vectors import step_sums

USES_TARGET = False
STEP_AGGREGATE = "sum"


def score(view, target):
    return view.norms.astype(np.float64)


def step_score(view, target):
    sums, _ = step_sums(view, view.sketches)
    return np.linalg.norm(sums, axis=1)
