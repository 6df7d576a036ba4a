"""The linear datamodeling score (LDS) with a bootstrap interval, and an attribution's margin over the log-only
controls on the same resamples.

Over subsets retrained with them removed, the LDS of an attribution is the Spearman correlation of
the change it predicts (minus the subset's summed scores: leaving out what raised f lowers it) with the
measured change of f(w_T). Its interval resamples the subsets with replacement (percentile, 95%); every
attribution of one cell is resampled with the same draws, so margins between two of them are paired.
"""

from __future__ import annotations

import numpy as np

from behaviortrace.common.seeds import cell_seed
from behaviortrace.evaluate import correlation

LEVEL = 0.95


class Resamples:
    """The bootstrap draws of one set of retrained subsets, and the ranks of the measured changes under them."""

    def __init__(self, changes: np.ndarray, n: int, seed: int, *cell):
        self.changes = np.asarray(changes, float)
        rng = np.random.default_rng(cell_seed("influence_lds_bootstrap", seed, *cell))
        self.index = rng.integers(0, len(self.changes), (n, len(self.changes)))
        self.change_ranks = correlation.ranks(self.changes[self.index])

    def lds(self, predicted: np.ndarray) -> tuple[float, np.ndarray]:
        """The LDS of these predictions and its value on every resample (NaN where a resample is constant)."""
        predicted = np.asarray(predicted, float)
        point = float(correlation.spearman(predicted, self.changes))
        return point, correlation.pearson(correlation.ranks(predicted[self.index]), self.change_ranks)


def interval(samples: np.ndarray) -> tuple[float, float]:
    """The percentile interval of bootstrap values (NaN resamples left out)."""
    tail = (1 - LEVEL) / 2 * 100
    finite = samples[np.isfinite(samples)]
    if not len(finite):
        return float("nan"), float("nan")
    return float(np.percentile(finite, tail)), float(np.percentile(finite, 100 - tail))


SIGNIFICANT = 12  # digits a subset's summed scores keep, so that sums equal but for rounding tie


def predicted_changes(per_unit: np.ndarray, members: list[np.ndarray]) -> np.ndarray:
    """Minus the summed values of each subset's members (`members`: row indices into `per_unit`), to SIGNIFICANT
    digits: two subsets whose scores add up to the same value in exact arithmetic (many zero scores, say) then
    tie on every processor, instead of being ordered by the last bit of a float sum."""
    return np.array([float(f"{-per_unit[m].sum():.{SIGNIFICANT}g}") for m in members])
