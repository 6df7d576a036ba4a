"""TRAK-style score <phi_target, (Phi^T Phi + lambda I)^-1 phi_z>, Phi the sketches of all rollouts.

lambda = lambda_scale x the mean diagonal of Phi^T Phi (0.1 as in the paper). The primal form solves a
k x k system; the dual form, (Phi Phi^T + lambda I)^-1 Phi phi_target, an n x n one; `form: auto` takes
the smaller. Minus the value, as in tracincp: positive means the rollout's update raised the target.
"""

import numpy as np

from behaviortrace.score.vectors import step_sums

USES_TARGET = True
STEP_AGGREGATE = "sum"


def ridge(phi: np.ndarray, lambda_scale: float) -> float:
    return lambda_scale * float(np.linalg.norm(phi).astype(np.float64) ** 2) / phi.shape[1]


def raw_scores(phi: np.ndarray, targets: np.ndarray, idx: np.ndarray, lam: float, form: str) -> np.ndarray:
    """[n] values targets[idx[i]]^T (Phi^T Phi + lam I)^-1 phi_i, for a few target vectors targets [C, k].

    Products with Phi run in its own precision (float32 sketches: fast), the solves in float64.
    """
    n, k = phi.shape
    rows = np.arange(n)
    targets64 = targets.astype(np.float64)
    if form == "auto":
        form = "primal" if k <= n else "dual"
    if form == "primal":
        gram = (phi.T @ phi).astype(np.float64) + lam * np.eye(k)
        weights = np.linalg.solve(gram, targets64.T)  # [k, C]; the Gram is symmetric
        return (phi @ weights.astype(phi.dtype))[rows, idx].astype(np.float64)
    if form == "dual":
        # (Phi^T Phi + lam I)^-1 = (I - Phi^T (K + lam I)^-1 Phi) / lam, with K = Phi Phi^T
        kernel = (phi @ phi.T).astype(np.float64)
        cross = (phi @ targets.T.astype(phi.dtype)).astype(np.float64)  # [n, C]
        solved = np.linalg.solve(kernel + lam * np.eye(n), cross)
        return (cross[rows, idx] - (kernel @ solved)[rows, idx]) / lam
    raise ValueError(f"trak form {form!r} is not one of auto, primal, dual")


def score(view, target, lambda_scale: float = 0.1, form: str = "auto"):
    phi = view.sketches
    idx, has = target.for_rows(view)
    values = raw_scores(phi, target.vectors, idx, ridge(phi, lambda_scale), form)
    return np.where(has, -values, 0.0)


def step_score(view, target, lambda_scale: float = 0.1, form: str = "auto"):
    """The step's summed feature against the target: by linearity, the sum of its rollouts' scores."""
    scores = score(view, target, lambda_scale, form)
    sums, _ = step_sums(view, scores[:, None])
    return sums[:, 0]
