"""The statistical rules behind every three-valued verdict of the checklist, apart from what the items read.

PASS needs every cell to clear its bar with its 95% interval: an intersection-union test, valid at 5% without a
correction however many cells. FAIL needs evidence at the family-wise level over the checklist's method tests: a
cell counts against a method only when its interval, widened to the Bonferroni level alpha / m (m: every test of
every method cell the checklist judges: a cell compared with seven controls holds seven), lies wholly on the wrong
side; with an interval's arms scaled by z(alpha / m) / z(2.5%),
a bootstrap interval keeps its skew. Anything else is inconclusive. Comparisons with a control are paired: the
difference of the two metrics on the same bootstrap resamples of the same cell, never two intervals side by side.
`diagnostics/checklist_error_rates.py` simulates the false pass, false FAIL and power of each kind of rule at a
run's own sizes (docs/evaluation.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from behaviortrace.report.significance import holm

PASS, FAIL, INCONCLUSIVE, NA = "pass", "fail", "inconclusive", "n/a"
Z95 = NormalDist().inv_cdf(0.975)


@dataclass(frozen=True)
class Family:
    """The family whose false FAILs are controlled: `tests` method tests at family-wise error `alpha`. A cell
    compared with several controls, or with a threshold and a margin, holds one test for each."""

    alpha: float
    tests: int

    @property
    def z(self) -> float:
        """How far a cell's interval is widened before it may count as a FAIL (one-sided, Bonferroni)."""
        return NormalDist().inv_cdf(1 - self.alpha / self.tests) if self.tests else Z95

    def budget(self, k: int) -> float:
        """The error a block of `k` tests may spend: their share of alpha (a union bound over blocks)."""
        return self.alpha * k / self.tests if self.tests else self.alpha


PER_CELL = Family(alpha=0.05, tests=0)  # 95% per cell: the first pass, which only counts the tests


def three(passes: list[bool], fails: list[bool]) -> str:
    """Every cell clears: pass; evidence against one: fail; otherwise inconclusive."""
    return FAIL if any(fails) else PASS if passes and all(passes) else INCONCLUSIVE


def widened_high(value: float, high: float, z: float) -> float:
    """The upper end of a 95% interval widened to the level whose one-sided quantile is `z`."""
    return value + (high - value) * z / Z95


def widened_low(value: float, low: float, z: float) -> float:
    return value - (value - low) * z / Z95


def at_least(value: float, low: float, high: float, limit: float, z: float) -> tuple[bool, bool]:
    """(passes, fails) of one cell that must reach `limit`: its interval at or above it; its widened interval
    wholly below it."""
    return bool(low >= limit), bool(widened_high(value, high, z) < limit)


def above(value: float, low: float, high: float, limit: float, z: float) -> tuple[bool, bool]:
    """The same for a cell that must lie strictly above `limit` (an AUC above 0.5, a difference above 0)."""
    return bool(low > limit), bool(widened_high(value, high, z) < limit)


def paired(own: np.ndarray, other: np.ndarray, own_value: float, other_value: float) -> tuple[float, float, float]:
    """The difference own - other and its 95% percentile interval over the shared bootstrap resamples."""
    diff = np.asarray(own, float) - np.asarray(other, float)
    diff = diff[np.isfinite(diff)]
    if not len(diff):
        return own_value - other_value, float("nan"), float("nan")
    low, high = np.percentile(diff, [2.5, 97.5])
    return own_value - other_value, float(low), float(high)


def margins_above(margins: list[tuple[float, float, float]], z: float) -> tuple[bool, bool]:
    """(passes, fails) of one cell of paired margins (value, low, high) that must all lie above 0: every 95%
    interval above 0; one widened to the family-wise level wholly below."""
    passes = bool(margins) and all(low > 0 for _, low, _ in margins)
    return passes, any(widened_high(v, high, z) < 0 for v, _, high in margins)


def range_bounds(lows, highs) -> tuple[float, float]:
    """The smallest and the largest max - min of values that each lie within their interval."""
    lows, highs = np.asarray(lows, float), np.asarray(highs, float)
    return max(0.0, float(lows.max() - highs.min())), float(highs.max() - lows.min())


def null_rejected(p_values: list[float], budget: float) -> list[bool]:
    """Holm's procedure over one block's p-values at the error the block may spend."""
    return holm(p_values, budget)


def beats_random(cells: list[tuple[float, float, float, int]], budget: float) -> tuple[list[bool], bool, float]:
    """Replay cells (change, lowest random change, highest random change, random sets): whether each cell's set
    lies below every one of its step-matched random sets (a pass needs every one), and whether the cells are
    evidence of a set no better than random (FAIL), with the chance of that evidence under that null. Such a set is
    exchangeable with its random sets, so it lies above all R of them with probability 1 / (R + 1), independently
    across cells (each cell its own retrainings): above all of them in every cell has probability prod 1 / (R + 1),
    a FAIL where that is within `budget`. Three random sets per cell never reach it in one cell (0.25), six cells
    do (2.4e-4)."""
    below = [bool(change < low) for change, low, _, _ in cells]
    chance = float(np.prod([1 / (reps + 1) for *_, reps in cells]))
    above = bool(cells) and all(change > high for change, _, high, _ in cells)
    return below, bool(above and chance <= budget), chance
