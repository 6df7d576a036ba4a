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
from behaviortrace.evaluate.correlation import SIGNIFICANT, interval  # noqa: F401 (callers read them here too)


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


POWER_DRAWS, POWER_RESAMPLES = 50, 200  # data sets drawn from a cell (power to about 0.07), each one's resamples


def power(changes: np.ndarray, predicted: dict, controls: list, limit: float, seed: int, *cell) -> dict[tuple, float]:
    """How often each attribution of one cell (`predicted`: its predicted changes, by key) would pass the LDS item's
    cell if its true effect were the one observed: the cell's subsets resampled as a new data set, POWER_DRAWS
    times, and the item's own rule applied to each (its LDS interval, from POWER_RESAMPLES resamples of that data
    set, at or above `limit`, and its margin over the strongest of `controls`, the maximum taken in each resample,
    above 0). A double bootstrap of the real statistic: what this run's design can show of that effect."""
    changes = np.asarray(changes, float)
    n = len(changes)
    rng = np.random.default_rng(cell_seed("influence_lds_power", seed, *cell))
    keys = list(predicted)
    values = np.stack([np.asarray(predicted[k], float) for k in keys])
    is_control = np.array([k in controls for k in keys])
    passed = np.zeros(len(keys))
    for _ in range(POWER_DRAWS):
        data = rng.integers(0, n, n)
        index = data[rng.integers(0, n, (POWER_RESAMPLES, n))]
        samples = correlation.pearson(correlation.ranks(values[:, index]), correlation.ranks(changes[index])[None])
        samples = np.where(np.isnan(samples), -np.inf, samples)  # a constant resample clears nothing
        ok = np.percentile(samples, 2.5, axis=1) >= limit
        if is_control.any():
            best = samples[is_control].max(axis=0)
            margin = np.where(np.isfinite(samples), samples - best[None, :], -np.inf)
            ok &= is_control | (np.percentile(margin, 2.5, axis=1) > 0)
        passed += ok
    return {k: float(p / POWER_DRAWS) for k, p in zip(keys, passed, strict=True)}


def predicted_changes(per_unit: np.ndarray, members: list[np.ndarray]) -> np.ndarray:
    """Minus the summed values of each subset's members (`members`: row indices into `per_unit`), to SIGNIFICANT
    digits: two subsets whose scores add up to the same value in exact arithmetic (many zero scores, say) then
    tie on every processor, instead of being ordered by the last bit of a float sum."""
    return np.array([float(f"{-per_unit[m].sum():.{SIGNIFICANT}g}") for m in members])
