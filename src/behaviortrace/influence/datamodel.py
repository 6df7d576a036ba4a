"""A cross-fitted linear datamodel: the measured change of f(w_T) fit as a linear function of which units a
subset zeroed, on half of the retrained subsets, and scored on the other half.

It is the best any additive attribution can do at predicting these subsets once enough subsets are
retrained (a datamodel's weights are an attribution fit to the measured changes themselves); with fewer
subsets than units it is limited by how little the subsets say about each unit. Each half is predicted by
a kernel ridge fit on the other (in its dual form: the kernel of two subsets is the number of units they
share), with the ridge chosen by leave-one-out error on the fitting half.
"""

from __future__ import annotations

import numpy as np

from behaviortrace.evaluate.correlation import spearman

RIDGES = 10.0 ** np.arange(-3, 5)  # times the mean subset size


def _fit_predict(k_train: np.ndarray, y: np.ndarray, k_test: np.ndarray) -> np.ndarray:
    """Kernel ridge predictions for the test rows, the ridge picked by closed-form leave-one-out error."""
    mean = y.mean()
    scale = float(np.mean(np.diag(k_train))) or 1.0
    best, chosen = np.inf, RIDGES[0]
    for ridge in RIDGES * scale:
        hat = k_train @ np.linalg.inv(k_train + ridge * np.eye(len(y)))
        residual = (y - mean - hat @ (y - mean)) / np.maximum(1 - np.diag(hat), 1e-12)
        if (error := float(np.mean(residual**2))) < best:
            best, chosen = error, ridge
    alpha = np.linalg.solve(k_train + chosen * np.eye(len(y)), y - mean)
    return mean + k_test @ alpha


def cross_fitted(membership: np.ndarray, changes: np.ndarray) -> np.ndarray:
    """Held-out predictions of every subset's change: subsets with even index predicted by a fit on the odd ones
    and the reverse. `membership` is subsets x units (1 where the subset zeroed the unit)."""
    x = np.asarray(membership, float)
    y = np.asarray(changes, float)
    kernel = x @ x.T
    out = np.empty(len(y))
    halves = [np.arange(0, len(y), 2), np.arange(1, len(y), 2)]
    for test, train in (halves, halves[::-1]):
        out[test] = _fit_predict(kernel[np.ix_(train, train)], y[train], kernel[np.ix_(test, train)])
    return out


def _halves(n: int) -> list[np.ndarray]:
    return [np.arange(0, n, 2), np.arange(1, n, 2)]


def within_fold_lds(predicted: np.ndarray, changes: np.ndarray) -> float:
    """The LDS of cross-fitted predictions, scored within each half and averaged: a Spearman pooled over the two
    halves mixes two fits' scales and is biased (about -0.1 on pure noise at 30 subsets)."""
    values = [spearman(predicted[h], changes[h]) for h in _halves(len(changes)) if len(h) >= 3]
    values = [v for v in values if np.isfinite(v)]
    return float(np.mean(values)) if values else float("nan")


def within_fold_samples(predicted: np.ndarray, changes: np.ndarray, n: int, seed: int) -> np.ndarray:
    """Bootstrap values of `within_fold_lds`: each half's subsets resampled within the half (the draws in the order
    one resample at a time takes them, every resample's Spearman computed at once)."""
    rng = np.random.default_rng(seed)
    halves = _halves(len(changes))
    draws = np.empty((n, len(changes)), dtype=np.int64)
    for b in range(n):
        draws[b] = np.concatenate([h[rng.integers(0, len(h), len(h))] for h in halves])
    parts = (draws[:, : len(halves[0])], draws[:, len(halves[0]) :])
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.stack([spearman(predicted[p], changes[p]) for p in parts], axis=1)
    out = np.full(n, np.nan)
    finite = np.isfinite(values).any(axis=1)
    out[finite] = np.nanmean(values[finite], axis=1)
    return out


def expected_lds(membership: np.ndarray, sims: int, seed: int) -> float:
    """The within-fold LDS the datamodel reaches at this design (which subsets zeroed which units) when the truth is
    exactly additive and noise-free: each unit's effect drawn at random, a subset's change their sum. Where even
    this stays below a threshold, the datamodel cannot show that any attribution could pass it."""
    rng = np.random.default_rng(seed)
    x = np.asarray(membership, float)
    values = []
    for _ in range(sims):
        truth = -x @ rng.standard_normal(x.shape[1])
        values.append(within_fold_lds(cross_fitted(x, truth), truth))
    return float(np.nanmean(values))
