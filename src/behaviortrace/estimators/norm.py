"""The magnitude control: the exact L2 norm of the rollout's gradient, no target.

Its step-level variant is the sketched norm of the step's summed (pre-clip) gradient: a step ranked by
how hard it pushed. With `use_clip` both are multiplied by the step's clip coefficient: the post-clip step
norm is what the paper's norm-only control measured on one sketch of each step's clipped gradient. Where
every step is clipped it is the same for every step; where most steps have no gradient at all (no reward
variance outside the bonus) it reads "this step paid".
"""

import numpy as np

from behaviortrace.common.vectors import clip_coefficients, step_sums

USES_TARGET = False
STEP_AGGREGATE = "sum"


def score(view, target, use_clip: bool = False):
    norms = view.norms.astype(np.float64)
    return norms * clip_coefficients(view) if use_clip else norms


def step_score(view, target, use_clip: bool = False):
    sums, first = step_sums(view, view.sketches)
    norms = np.linalg.norm(sums, axis=1)
    return norms * clip_coefficients(view)[first] if use_clip else norms
