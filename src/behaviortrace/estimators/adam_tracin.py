"""Adam-aware TracIn: each rollout's first-order effect on the target through the optimizer that trained it.

TRL clips the step gradient (coefficient c_t) and AdamW folds it into its momentum, so rollout z of step t
moves the weights at every later step s by -lr_s (1 - b1) b1^(s-t) / (1 - b1^(s+1)) c_t g_z / D_s, with D_s
AdamW's per-coordinate denominator sqrt(v_s / (1 - b2^(s+1))) + eps. Its first-order effect on the target
f is therefore

    score_z = -c_t A_t <grad f, g_z / D>,   A_t = sum_{s >= t} lr_s (1 - b1) b1^(s-t) / (1 - b1^(s+1)),

with positive meaning the rollout raised the target's log-prob. Exact: the rollout's gradient (at its
step's weights with train-time capture), the clip coefficient, the logged learning rates, the momentum
and bias-correction factors up to the last step. Approximated: D_s is taken at the analysis checkpoint of
the rollout (saved right after that checkpoint's own update), for all s; grad f is taken there too (as in
tracincp); the rollout's own share of v and of the clip coefficient is held fixed; weight decay, which no
rollout changes, is left out. D is applied to the dense target gradient before sketching (targets stage),
so <S(grad f / D), S g_z> estimates <grad f, g_z / D> without sketching preconditioned rollouts.
"""

from dataclasses import replace

import numpy as np

from behaviortrace.common.vectors import step_sums, target_inner

USES_TARGET = True
STEP_AGGREGATE = "sum"
# Its step scores are first-order predictions of the target's change (evaluate/effect.py).
PREDICTS_CHANGE = True


def momentum_factor(lr: np.ndarray, beta1: float) -> np.ndarray:
    """A_t for steps 0..T-1 (update t+1 of AdamW), from the learning rate of every step: how much of a unit
    of step t's clipped gradient AdamW's momentum puts into all updates from step t to the last."""
    out = np.zeros(len(lr))
    later = 0.0
    for t in range(len(lr) - 1, -1, -1):
        later = lr[t] * (1 - beta1) / (1 - beta1 ** (t + 1)) + beta1 * later
        out[t] = later
    return out


def score(view, target):
    idx, has = _rows(view, target)
    inner = target_inner(view.sketches, replace(target, vectors=target.preconditioned), idx)
    return np.where(has, -_coefficient(view, target) * inner, 0.0)


def step_score(view, target):
    """The step's summed gradient sketch against the preconditioned target: the step's first-order effect."""
    sums, first = step_sums(view, view.sketches)
    idx, has = _rows(view, target)
    inner = np.einsum("sk,sk->s", sums, target.preconditioned[idx[first]])
    return np.where(has[first], -_coefficient(view, target)[first] * inner, 0.0)


def _rows(view, target) -> tuple[np.ndarray, np.ndarray]:
    if target.preconditioned is None:
        raise ValueError(
            f"the {target.kind} target store holds no Adam-preconditioned vectors: rerun its targets job "
            "(and training, if its checkpoints.json names no AdamW second moments)"
        )
    idx, has = target.for_rows(view)
    lacking = has & ~target.has_adam[idx]
    if lacking.any():
        step = int(target.checkpoint_steps[idx[lacking][0]])
        raise ValueError(f"no AdamW second moment at analysis checkpoint {step}, used by {int(lacking.sum())} rollouts")
    return idx, has


def _coefficient(view, target) -> np.ndarray:
    """Per rollout: c_t A_t of its step."""
    steps = view.steps.sort("step")
    if steps["step"].to_list() != list(range(steps.height)):
        raise ValueError("adam_tracin needs every step from 0 on: the momentum of a step reaches all later ones")
    per_step = steps["clip_coef"].to_numpy() * momentum_factor(steps["lr"].to_numpy(), target.adam["beta1"])
    return per_step[view.rollouts["step"].to_numpy()]
