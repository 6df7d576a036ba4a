"""Vector helpers estimators share: per-step sums of rollout rows, and inner products and cosines
with each row's target vector."""

from __future__ import annotations

import numpy as np


def step_sums(view, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step (ascending), the sum of the step's rows of `vectors`, and the row index of each step's first row."""
    steps = view.rollouts["step"].to_numpy()
    uniq, first = np.unique(steps, return_index=True)
    order = np.argsort(steps, kind="stable")
    starts = np.searchsorted(steps[order], uniq)
    return np.add.reduceat(vectors[order], starts, axis=0).astype(np.float64), first


def target_inner(matrix: np.ndarray, target, idx: np.ndarray) -> np.ndarray:
    """<matrix row i, target vector idx[i]> for every row, as one matrix product with the few targets."""
    return (matrix @ target.vectors.T.astype(matrix.dtype))[np.arange(len(idx)), idx].astype(np.float64)


def target_cosine(matrix: np.ndarray, target, idx: np.ndarray) -> np.ndarray:
    """Cosine of each row with its target vector; 0 where either is zero."""
    norms = np.linalg.norm(matrix, axis=1).astype(np.float64)
    t_norms = np.linalg.norm(target.vectors, axis=1).astype(np.float64)[idx]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.nan_to_num(target_inner(matrix, target, idx) / (norms * t_norms), nan=0.0, posinf=0.0, neginf=0.0)
