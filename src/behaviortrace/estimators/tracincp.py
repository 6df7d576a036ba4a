"""TracInCP: learning rate x <S g_z, S g_target> at the checkpoint that generated the rollout.

Sketches hold loss gradients and the update moved against them, so the score is minus the inner
product: positive when the rollout's update raised the target's log-prob.
"""

import numpy as np

from behaviortrace.common.vectors import clip_coefficients, step_sums, target_inner

USES_TARGET = True
STEP_AGGREGATE = "sum"
# Its step scores are the plain-gradient-step prediction of the target's change (evaluate/effect.py).
PREDICTS_CHANGE = True


def score(view, target, use_clip: bool = False):
    idx, has = target.for_rows(view)
    inner = target_inner(view.sketches, target, idx)
    return np.where(has, -_rate(view, use_clip) * inner, 0.0)


def step_score(view, target, use_clip: bool = False):
    """The step's summed gradient sketch against the target (the paper's step-level TracInCP)."""
    sums, first = step_sums(view, view.sketches)
    idx, has = target.for_rows(view)
    inner = np.einsum("sk,sk->s", sums, target.vectors[idx[first]])
    return np.where(has[first], -_rate(view, use_clip)[first] * inner, 0.0)


def _rate(view, use_clip: bool) -> np.ndarray:
    lr = view.rollouts["lr"].to_numpy()
    return lr * clip_coefficients(view) if use_clip else lr
