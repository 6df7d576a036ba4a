"""Rank and linear correlation along the last axis, shared by the effect metrics (bootstrap rows of steps)
and the influence table (one vector of rollouts)."""

from __future__ import annotations

import numpy as np


def ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks along the last axis (ties share their mean rank)."""
    x = np.asarray(x)
    flat = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    out = np.empty(flat.shape, dtype=np.float64)
    for row in range(flat.shape[0]):
        _, inverse, counts = np.unique(flat[row], return_inverse=True, return_counts=True)
        out[row] = ((np.cumsum(counts) - counts) + (counts - 1) / 2)[inverse]
    return out.reshape(x.shape)


def pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson correlation along the last axis; NaN where either side is constant."""
    xc, yc = x - x.mean(-1, keepdims=True), y - y.mean(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (xc * yc).sum(-1) / np.sqrt((xc**2).sum(-1) * (yc**2).sum(-1))


def spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return pearson(ranks(x), ranks(y))


def partial_spearman(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Spearman correlation of x and y given z, along the last axis: what remains of their agreement once a
    shared trend in z (the step number, where both decay with it) is taken out. The partial Pearson correlation
    of the ranks; NaN where z's ranks explain x's or y's entirely."""
    rx, ry, rz = (ranks(np.asarray(v, float)) for v in (x, y, z))
    xy, xz, yz = pearson(rx, ry), pearson(rx, rz), pearson(ry, rz)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (xy - xz * yz) / np.sqrt((1 - xz**2) * (1 - yz**2))
