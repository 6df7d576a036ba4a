"""TRAK-style score <phi_target, (Phi^T Phi + lambda I)^-1 phi_z>, Phi the sketches of all rollouts.

lambda = lambda_scale x the mean diagonal of Phi^T Phi (0.1 as in the paper). The primal form solves a
k x k system; the dual form, (Phi Phi^T + lambda I)^-1 Phi phi_target, an n x n one; `form: auto` takes
the smaller. Minus the value, as in tracincp: positive means the rollout's update raised the target.
"""

import numpy as np

from . import step_sums

USES_TARGET = True
STEP_AGGREGATE = "sum"


def ridge(phi: np.ndarray, lambda_scale: float) -> float:
    return lambda_scale * float(np.einsum("nk,nk->", phi, phi)) / phi.shape[1]


def raw_scores(phi: np.ndarray, targets: np.ndarray, idx: np.ndarray, lam: float, form: str) -> np.ndarray:
    """[n] values targets[idx[i]]^T (Phi^T Phi + lam I)^-1 phi_i, for a few target vectors targets [C, k]."""
    n, k = phi.shape
    if form == "auto":
        form = "primal" if k <= n else "dual"
    if form == "primal":
        weights = np.linalg.solve(phi.T @ phi + lam * np.eye(k), targets.T)  # [k, C], the Gram is symmetric
        return np.einsum("nk,nk->n", phi, weights.T[idx])
    if form == "dual":
        # (Phi^T Phi + lam I)^-1 = (I - Phi^T (K + lam I)^-1 Phi) / lam, with K = Phi Phi^T
        kernel = phi @ phi.T
        solved = np.linalg.solve(kernel + lam * np.eye(n), phi @ targets.T)  # [n, C]
        rows = np.arange(n)
        direct = np.einsum("nk,nk->n", phi, targets[idx])
        return (direct - (kernel @ solved)[rows, idx]) / lam
    raise ValueError(f"trak form {form!r} is not one of auto, primal, dual")


def score(view, target, lambda_scale: float = 0.1, form: str = "auto"):
    phi = view.sketches.astype(np.float64)
    idx, has = target.for_rows(view)
    values = raw_scores(phi, target.vectors.astype(np.float64), idx, ridge(phi, lambda_scale), form)
    return np.where(has, -values, 0.0)


def step_score(view, target, lambda_scale: float = 0.1, form: str = "auto"):
    """The step's summed feature against the target: by linearity, the sum of its rollouts' scores."""
    scores = score(view, target, lambda_scale, form)
    sums, _ = step_sums(view, scores[:, None])
    return sums[:, 0]
