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
