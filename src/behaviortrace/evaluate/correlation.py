"""Rank and linear correlation along the last axis, shared by the effect metrics (bootstrap rows of steps)
and the influence table (one vector of rollouts)."""

from __future__ import annotations

import numpy as np


def ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks along the last axis (ties share their mean rank; NaNs tie with each other, ranked last).

    All rows at once: each row sorted, a tie group's first position and size found from where the sorted values
    change, and a member's rank its group's start + (size - 1) / 2 (half-integers, exact in float64)."""
    x = np.asarray(x)
    flat = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    rows, n = flat.shape
    order = np.argsort(flat, axis=1, kind="stable")
    ordered = np.take_along_axis(flat, order, axis=1)
    first = np.ones((rows, n), dtype=bool)  # where a tie group begins in the sorted row
    if n > 1:
        differ = ordered[:, 1:] != ordered[:, :-1]
        if ordered.dtype.kind in "fc":
            differ &= ~(np.isnan(ordered[:, 1:]) & np.isnan(ordered[:, :-1]))
        first[:, 1:] = differ
    position = np.broadcast_to(np.arange(n), (rows, n))
    start = np.maximum.accumulate(np.where(first, position, 0), axis=1)
    following = np.concatenate([np.where(first[:, 1:], position[:, 1:], n), np.full((rows, 1), n)], axis=1)
    end = np.minimum.accumulate(following[:, ::-1], axis=1)[:, ::-1]
    out = np.empty((rows, n), dtype=np.float64)
    np.put_along_axis(out, order, start + (end - start - 1) / 2, axis=1)
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


LEVEL = 0.95  # of every bootstrap interval
SIGNIFICANT = 12  # digits a sum of scores keeps, so that sums equal but for rounding tie on every processor


def interval(samples: np.ndarray) -> tuple[float, float]:
    """The percentile interval of bootstrap values (NaN resamples left out)."""
    tail = (1 - LEVEL) / 2 * 100
    finite = samples[np.isfinite(samples)]
    if not len(finite):
        return float("nan"), float("nan")
    return float(np.percentile(finite, tail)), float(np.percentile(finite, 100 - tail))
