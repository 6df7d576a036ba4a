"""Vector helpers estimators share: per-step sums of rollout rows, and inner products and cosines
with each row's target vector."""

from __future__ import annotations

import numpy as np


def step_sums(view, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step (ascending), the sum of the step's rows of `vectors` (accumulated in float64), and the row
    index of each step's first row."""
    steps = view.rollouts["step"].to_numpy()
    uniq, first = np.unique(steps, return_index=True)
    if not np.all(steps[1:] >= steps[:-1]):  # the sketch stores keep rows in step order; others are sorted
        order = np.argsort(steps, kind="stable")
        vectors, steps = vectors[order], steps[order]
    bounds = np.r_[np.searchsorted(steps, uniq), len(steps)]
    sums = [
        np.asarray(vectors[a:b], dtype=np.float64).sum(axis=0) for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return np.stack(sums), first


def clip_coefficients(view) -> np.ndarray:
    """Each rollout's step clip coefficient (min(1, max_grad_norm / the step's pre-clip gradient norm), from
    the step log): what the optimizer applied to the step's summed gradient."""
    clip = dict(zip(view.steps["step"].to_list(), view.steps["clip_coef"].to_list(), strict=False))
    return np.array([clip[s] for s in view.rollouts["step"].to_list()], dtype=np.float64)


def row_norms(matrix: np.ndarray) -> np.ndarray:
    """L2 norm of every row, accumulated in float64."""
    return np.sqrt(np.einsum("ij,ij->i", matrix, matrix, dtype=np.float64))


def target_inner(matrix: np.ndarray, target, idx: np.ndarray) -> np.ndarray:
    """<matrix row i, target vector idx[i]> for every row, as one matrix product with the few targets."""
    return (matrix @ target.vectors.T.astype(matrix.dtype))[np.arange(len(idx)), idx].astype(np.float64)


def target_cosine(matrix: np.ndarray, target, idx: np.ndarray) -> np.ndarray:
    """Cosine of each row with its target vector; 0 where either is zero."""
    norms = row_norms(matrix)
    t_norms = row_norms(target.vectors)[idx]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.nan_to_num(target_inner(matrix, target, idx) / (norms * t_norms), nan=0.0, posinf=0.0, neginf=0.0)
