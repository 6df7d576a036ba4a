"""The dense endpoint (influence-table rows, computed in influence/table.py): each attribution's rank agreement
with the exact influence I over every rollout, and every prompt group, before T, pooled over the planted seeds and
draws.

The LDS reads a few dozen random subsets, whose summed scores are dominated by the few rollouts that matter most;
I is known for every rollout, so the same question (does a score order the rollouts as removing them would?) can
be asked of all of them at no retraining cost. Per seed and draw, the Spearman correlation of the scores with I
(at group level: of the members' summed scores with their summed I); pooled, the mean over seeds and draws.

The interval is a two-stage bootstrap: the planted seeds resampled with replacement, then each drawn seed's prompt
groups (a group's rollouts share a prompt and an advantage baseline, so they are not independent). Training noise
between seeds is inside the interval, not only the sampling of rollouts within one run. Every attribution is
resampled with the same draws, so its margins over the strongest log-only control (the strongest taken in each
resample) and over the random control are paired differences.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from behaviortrace.common.seeds import cell_seed
from behaviortrace.evaluate import correlation
from behaviortrace.evaluate.correlation import SIGNIFICANT, interval

LEVELS = ("rollout_dense", "group_dense")
STEP_OUT_POOLED = "step_out_pooled"  # leave-one-step-out through the same statistic, steps as the units
RANDOM = "random"  # the estimator whose margin says how far an attribution is from chance


@dataclass
class DenseSeed:
    """One planted seed's rollouts before T: their group (0..G-1), I under the configured meaning of removal, and
    every attribution's scores on them, by (draw, estimator, target); draw None for one that has no draws."""

    seed: int
    groups: np.ndarray
    influence: np.ndarray
    scores: dict[tuple, np.ndarray]

    def units(self, level: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(I per unit, scores per unit as rows in `keys` order, each unit's group) at `level`."""
        values = np.stack([self.scores[k] for k in self.keys])
        if level == "rollout_dense":
            return self.influence, values, self.groups
        n = int(self.groups.max()) + 1
        summed = np.stack([np.bincount(self.groups, weights=v, minlength=n) for v in values])
        infl = np.bincount(self.groups, weights=self.influence, minlength=n)
        return _rounded(infl), _rounded(summed), np.arange(n)

    @property
    def keys(self) -> list[tuple]:
        return sorted(self.scores, key=lambda k: (k[0] is not None, k[0] or 0, k[1], k[2]))


def _rounded(x: np.ndarray) -> np.ndarray:
    """Sums to SIGNIFICANT digits, so that sums equal in exact arithmetic tie on every processor."""
    return np.vectorize(lambda v: float(f"{v:.{SIGNIFICANT}g}"))(x) if x.size else x


def _spearman_rows(infl: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The Spearman correlation of every row of `values` with `infl` (NaN for a constant row)."""
    return correlation.pearson(correlation.ranks(values), correlation.ranks(infl)[None, :])


class _Weighted:
    """Spearman correlations of many score rows with I on bootstrap resamples given as multiplicities (how often
    each unit was drawn), without sorting again: a resample's average ranks follow from each row's order, sorted
    once, and the drawn units' counts accumulated along it (a tie group of total count W after C smaller draws
    holds ranks C + 1 .. C + W, mean C + (W + 1) / 2). The same values as ranking the drawn units laid out one by
    one (tests/test_influence.py checks it against that)."""

    def __init__(self, infl: np.ndarray, values: np.ndarray):
        rows = np.vstack([values, infl[None, :]])
        self.order = np.argsort(rows, axis=1, kind="stable")
        ordered = np.take_along_axis(rows, self.order, axis=1)
        n = rows.shape[1]
        first = np.ones(ordered.shape, bool)
        first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
        last = np.ones(ordered.shape, bool)
        last[:, :-1] = first[:, 1:]
        flat = np.arange(ordered.size).reshape(ordered.shape)
        # Per sorted position, the flat positions of its tie group's first and last member.
        self.first = np.maximum.accumulate(np.where(first, flat, 0), axis=1).ravel()
        self.last = np.minimum.accumulate(np.where(last, flat, ordered.size)[:, ::-1], axis=1)[:, ::-1].ravel()
        self.shape, self.n = ordered.shape, n

    def spearman(self, weights: np.ndarray) -> np.ndarray:
        """Per resample (a row of `weights`: each unit's count), every score row's Spearman with I: (resamples,
        score rows); one resample (a 1-d `weights`) gives one value per score row."""
        if weights.ndim == 1:
            return self.spearman(weights[None, :])[0]
        m = len(weights)
        drawn = weights[:, self.order]  # each row's counts in its own sorted order: (m, rows, n)
        upto = np.cumsum(drawn, axis=2).reshape(m, -1)
        flat = drawn.reshape(m, -1)
        before = upto[:, self.first] - flat[:, self.first]
        ranks = (before + (upto[:, self.last] - before + 1) / 2).reshape(m, *self.shape)
        own = np.empty((m, self.n))
        own[:, self.order[-1]] = ranks[:, -1]  # I's ranks in unit order, read in each row's sorted order below
        x, y, w = ranks[:, :-1], own[:, self.order[:-1]], drawn[:, :-1]
        total = weights.sum(1)[:, None, None]
        xc = x - (w * x).sum(2, keepdims=True) / total
        yc = y - (w * y).sum(2, keepdims=True) / total
        with np.errstate(invalid="ignore", divide="ignore"):
            return (w * xc * yc).sum(2) / np.sqrt((w * xc**2).sum(2) * (w * yc**2).sum(2))


def _pooled(cells: list[tuple[list[tuple], np.ndarray]]) -> dict[tuple, float]:
    """Per (estimator, target): the mean of its correlations over every (seed, draw) cell it has."""
    found: dict[tuple, list[float]] = {}
    for own_keys, rho in cells:
        for (_, est, target), r in zip(own_keys, rho, strict=True):
            found.setdefault((est, target), []).append(r)
    return {k: float(np.mean(v)) for k, v in found.items()}


CHUNK = 200_000  # elements (resamples x score rows x units) ranked at once: large arrays would leave the cache


def _bootstrap(parts: list, keys: list[tuple], bootstrap: int, rng) -> np.ndarray:
    """The pooled agreement of every (estimator, target) of `keys` on each two-stage resample: (bootstrap, keys).
    The seeds are drawn first (with replacement), then each drawn seed's groups; a key's value is the mean over the
    cells (seed and draw) it has in the resample."""
    picks = rng.integers(0, len(parts), (bootstrap, len(parts)))
    sums, counts = np.zeros((bootstrap, len(keys))), np.zeros((bootstrap, len(keys)))
    column = {k: j for j, k in enumerate(keys)}
    for i, (s, _, _, groups, weighted) in enumerate(parts):
        where = np.argwhere(picks == i)[:, 0]  # the resample of each of this seed's occurrences
        if not len(where):
            continue
        n_groups = int(groups.max()) + 1
        draws = rng.integers(0, n_groups, (len(where), n_groups))
        draws += np.arange(len(where))[:, None] * n_groups  # one bincount for every occurrence's group counts
        per_group = np.bincount(draws.ravel(), minlength=len(where) * n_groups).reshape(len(where), n_groups)
        to = np.array([column[(est, target)] for _, est, target in s.keys])
        step = max(1, CHUNK // weighted.order.size)
        for start in range(0, len(where), step):
            rho = weighted.spearman(per_group[start : start + step][:, groups].astype(float))
            rows = where[start : start + step]
            np.add.at(sums, (rows[:, None], to[None, :]), rho)
            np.add.at(counts, (rows[:, None], to[None, :]), 1.0)
    return sums / counts


def dense(
    seeds: list[DenseSeed], level: str, log_only: tuple[str, ...], bootstrap: int, seed: int, name: str = ""
) -> list[dict]:
    """The pooled agreement of every (estimator, target) at `level` with its interval and its margins over the
    strongest log-only control and over the random control: one dict per (estimator, target) with `spearman`,
    `over_log_only`, `over_random` (each with `_low`, `_high`) and `n` (the units pooled). `name` tells the
    bootstrap's draws apart from another use of the same level (leave-one-step-out: steps as rollouts)."""
    parts = [(s, *s.units(level)) for s in seeds]
    point = _pooled([(s.keys, _spearman_rows(infl, values)) for s, infl, values, _ in parts])
    parts = [(*p, _Weighted(p[1], p[2])) for p in parts]
    rng = np.random.default_rng(cell_seed("dense_bootstrap", seed, level, name))
    keys = sorted(point)
    resampled = _bootstrap(parts, keys, bootstrap, rng)
    samples = {k: resampled[:, j] for j, k in enumerate(keys)}
    controls = [k for k in point if k[0] in log_only]
    chance = [k for k in point if k[0] == RANDOM]
    n = sum(len(p[1]) for p in parts)
    rows = []
    for key in sorted(point):
        row = {"estimator": key[0], "target": key[1], "n": n, **_with_interval("spearman", point[key], samples[key])}
        if key[0] not in log_only and controls:
            best = np.nanmax(np.stack([samples[c] for c in controls]), axis=0)
            margin = point[key] - np.nanmax([point[c] for c in controls])
            row |= _with_interval("over_log_only", margin, samples[key] - best)
        if key[0] != RANDOM and chance:
            row |= _with_interval("over_random", point[key] - point[chance[0]], samples[key] - samples[chance[0]])
        rows.append(row)
    return rows


def _with_interval(metric: str, value: float, samples: np.ndarray) -> dict:
    low, high = interval(samples)
    return {metric: float(value), f"{metric}_low": low, f"{metric}_high": high}
