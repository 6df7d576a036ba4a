"""Ranking metrics against binary labels, tie-aware and weighted.

Every metric takes scores, labels and bootstrap weights of the rows, B replicates (one of them all ones for
the point estimate), and returns B values, so a cluster bootstrap is one vectorized call. The weights are a
row-weight matrix [B, n] or, without ever building that matrix, a `Weights` (cluster weights and each row's
cluster). Ties are handled exactly: AUCs count a tied pair as one half; precision at n_paid is its expectation
over the random orders of tied rows; average precision takes a block of tied rows at once.
"""

from __future__ import annotations

import math

import numpy as np


class Weights:
    """Row weights of B bootstrap replicates kept per cluster: `by_cluster` [clusters, B] and each row's cluster.

    A cluster bootstrap gives all rows of a cluster one weight, so the [B, n] matrix of row weights repeats
    columns; weighted sums are taken over (segment, cluster) pairs instead, which never builds that matrix.
    """

    def __init__(self, by_cluster: np.ndarray, cluster: np.ndarray):
        self.by_cluster = np.ascontiguousarray(by_cluster, dtype=np.float64)
        self.cluster = np.asarray(cluster)

    @classmethod
    def of(cls, weights: Weights | np.ndarray) -> Weights:
        """`weights` itself, or a row-weight matrix [B, n] as Weights (each row its own cluster)."""
        if isinstance(weights, Weights):
            return weights
        weights = np.asarray(weights, dtype=np.float64)
        return cls(weights.T, np.arange(weights.shape[1]))

    @property
    def replicates(self) -> int:
        return self.by_cluster.shape[1]

    def take(self, rows: np.ndarray) -> Weights:
        """The weights of some rows only (no copy of the cluster weights)."""
        return Weights(self.by_cluster, self.cluster[rows])

    def sums(self, values: np.ndarray, segment: np.ndarray | None = None, n_segments: int = 1) -> np.ndarray:
        """Weighted sums of `values` [n] over the rows of each segment (ids 0..n_segments-1; default: one
        segment of all rows), [n_segments, B]. Rows of one cluster in one segment are added up first."""
        n_clusters, n_boot = self.by_cluster.shape
        segment = np.zeros(len(values), dtype=np.int64) if segment is None else segment
        pairs, inverse = np.unique(segment * n_clusters + self.cluster, return_inverse=True)
        per_pair = np.bincount(inverse, weights=values, minlength=len(pairs))
        pair_segment, pair_cluster = np.divmod(pairs, n_clusters)
        # Pairs come sorted by segment: one reduceat over their weighted rows adds all replicates at once.
        weighted = self.by_cluster[pair_cluster]
        weighted *= per_pair[:, None]
        out = np.zeros((n_segments, n_boot))
        if len(pairs):
            starts = np.flatnonzero(np.r_[True, pair_segment[1:] != pair_segment[:-1]])
            out[pair_segment[starts]] = np.add.reduceat(weighted, starts, axis=0)
        return out


def _levels(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order of rows by ascending score, and the start of each block of tied scores in that order."""
    order = np.argsort(scores, kind="stable")
    s = scores[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    return order, starts


def level_sums(scores, labels, weights) -> tuple[np.ndarray, np.ndarray]:
    """paid weight and all weight per tie level in ascending score order, [levels, B] each.

    Runs of levels without paid rollouts are merged into one level: they add nothing to AUROC, precision at n_paid or
    average precision but their weight below (or above) the paid rollouts levels, which merging keeps. On real data
    that leaves a few thousand levels instead of one per row.
    """
    w = Weights.of(weights)
    order, starts = _levels(scores)
    sizes = np.diff(np.r_[starts, len(order)])
    level = np.empty(len(order), dtype=np.int64)
    level[order] = np.repeat(np.arange(len(starts)), sizes)
    paid = labels != 0
    has_paid = np.bincount(level[paid], minlength=len(starts)) > 0
    # A merged level starts at every paid level and right after it (and at the first level).
    merged = np.cumsum(has_paid | np.r_[True, has_paid[:-1]]) - 1
    n_merged = int(merged[-1]) + 1 if len(merged) else 0
    pos = w.take(paid).sums(labels[paid], merged[level[paid]], n_merged)
    cnt = w.sums(np.ones(len(order)), merged[level], n_merged)
    return pos, cnt


def _descending(scores, labels, weights, ascending=None) -> tuple[np.ndarray, np.ndarray]:
    """level_sums in descending score order; the ascending sums reversed, unless NaN scores (which argsort
    puts last in both directions) make the two orders differ."""
    if ascending is not None and not np.isnan(scores).any():
        return ascending[0][::-1], ascending[1][::-1]
    return level_sums(-scores, labels, weights)


def _auroc(pos, cnt) -> np.ndarray:
    neg = cnt - pos
    below = np.cumsum(neg, axis=0) - neg
    with np.errstate(invalid="ignore", divide="ignore"):
        return (pos * (below + 0.5 * neg)).sum(0) / (pos.sum(0) * neg.sum(0))


def _precision_at_paid(pos, cnt) -> np.ndarray:
    m = pos.sum(0)
    before_cnt = np.cumsum(cnt, axis=0) - cnt
    # Rows of each block that fall inside the top m, and the share of the block's paid they carry.
    taken = np.clip(m - before_cnt, 0, cnt)
    with np.errstate(invalid="ignore", divide="ignore"):
        gained = np.where(cnt > 0, pos * taken / np.where(cnt > 0, cnt, 1), 0.0)
        return gained.sum(0) / m


def _average_precision(pos, cnt) -> np.ndarray:
    cum_cnt, cum_pos = np.cumsum(cnt, axis=0), np.cumsum(pos, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        prec = np.where(cum_cnt > 0, cum_pos / np.where(cum_cnt > 0, cum_cnt, 1), 0.0)
        return (prec * pos).sum(0) / pos.sum(0)


def auroc(scores, labels, weights) -> np.ndarray:
    return _auroc(*level_sums(scores, labels, weights))


def precision_at_paid(scores, labels, weights) -> np.ndarray:
    """Expected precision of the top m rows (m = weighted paid count), ties broken at random."""
    return _precision_at_paid(*_descending(scores, labels, weights))


def average_precision(scores, labels, weights) -> np.ndarray:
    """Sum over score thresholds of precision x recall gained; a block of ties enters at once."""
    return _average_precision(*_descending(scores, labels, weights))


def ranking_metrics(scores, labels, weights) -> dict[str, np.ndarray]:
    """AUROC, average precision and precision at n_paid from one computation of the level sums (the costly part)."""
    ascending = level_sums(scores, labels, weights)
    descending = _descending(scores, labels, weights, ascending)
    return {
        "auroc": _auroc(*ascending),
        "average_precision": _average_precision(*descending),
        "precision_at_paid": _precision_at_paid(*descending),
    }


def chance(labels, weights) -> np.ndarray:
    w = Weights.of(weights)
    with np.errstate(invalid="ignore", divide="ignore"):
        return w.sums(labels)[0] / w.sums(np.ones(len(labels)))[0]


def ceiling(tie_blocks: np.ndarray, labels, weights) -> np.ndarray:
    """Best precision at n_paid any score could reach when rows of a block must share a score
    (every row its own block at rollout level; a step's rollouts one block at step level)."""
    w = Weights.of(weights)
    _, block = np.unique(tie_blocks, return_inverse=True)
    if len(np.unique(block * len(w.by_cluster) + w.cluster)) == block.max() + 1:
        # Every block lies within one cluster, so its purity is the same in each replicate that weighs it
        # (and a block without weight adds nothing): blocks of equal purity merge, which leaves few to sort.
        unweighted = np.bincount(block, weights=labels) / np.bincount(block)
        _, block = np.unique(unweighted[block], return_inverse=True)
    n_blocks = block.max() + 1
    pos = w.sums(labels, block, n_blocks).T  # [B, blocks]
    cnt = w.sums(np.ones(len(block)), block, n_blocks).T
    with np.errstate(invalid="ignore", divide="ignore"):
        purity = np.where(cnt > 0, pos / np.where(cnt > 0, cnt, 1), -1.0)
    best = np.argsort(-purity, axis=1, kind="stable")
    return fill_blocks(np.take_along_axis(pos, best, 1), np.take_along_axis(cnt, best, 1))


def fill_blocks(pos: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    """Precision of the top m rows when blocks are taken whole in the given order (the last one in part);
    blocks along the last axis, NaN where there is no paid."""
    m = pos.sum(-1)
    before = np.cumsum(cnt, -1) - cnt
    taken = np.clip(m[..., None] - before, 0, cnt)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(cnt > 0, pos / np.where(cnt > 0, cnt, 1), 0.0)
        return np.where(m > 0, (share * taken).sum(-1) / m, np.nan)


def pair_counts(scores, labels, groups, fluency=None, max_gap: float = np.inf):
    """Per group: concordant paid-vs-other pairs (ties count one half) and all such pairs, and group ids.
    With `fluency`, only pairs whose fluency differs by at most `max_gap` (matched pairs)."""
    ids, inverse = np.unique(groups, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    sizes = np.bincount(inverse)
    first = np.cumsum(sizes) - sizes  # where each group's rows start in `order`
    conc, total = np.zeros(len(ids)), np.zeros(len(ids))
    # Groups of one size form a [groups, size] block of rows, so all their pairs are compared at once.
    for size in np.unique(sizes):
        of_size = np.flatnonzero(sizes == size)
        rows = order[first[of_size, None] + np.arange(size)]
        y, s = labels[rows].astype(bool), scores[rows]
        pair = y[:, :, None] & ~y[:, None, :]  # [group, paid row, other row]
        if fluency is not None:
            f = fluency[rows]
            pair &= np.abs(f[:, :, None] - f[:, None, :]) <= max_gap
        above, tied = s[:, :, None] > s[:, None, :], s[:, :, None] == s[:, None, :]
        conc[of_size] = (above & pair).sum((1, 2)) + 0.5 * (tied & pair).sum((1, 2))
        total[of_size] = pair.sum((1, 2))
    return conc, total, ids


def matched_pairs(labels, blocks, covariate, max_gap: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """paid-vs-other pairs inside one block (a step) whose covariate differs by at most `max_gap`, across the
    block's prompt groups: (paid row, other row, block index) per pair, blocks numbered as np.unique(blocks).

    Matching alone does not put a score that is the covariate at chance: inside any window the paid rows can sit
    systematically higher (GRPO's advantages of a paid rollout carry the bonus's spread into their last digits).
    Compare residualized scores on these pairs (`residualize`) for a metric the covariate cannot win."""
    _, inverse = np.unique(blocks, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(inverse.max(initial=-1) + 2))
    paid = labels != 0
    found = []
    for block in range(len(bounds) - 1):
        rows = order[bounds[block] : bounds[block + 1]]
        pos, neg = rows[paid[rows]], rows[~paid[rows]]
        close = np.abs(covariate[pos][:, None] - covariate[neg][None, :]) <= max_gap
        i, j = np.nonzero(close)
        found.append((pos[i], neg[j], np.full(len(i), block)))
    if not found:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    return tuple(np.concatenate(parts) for parts in zip(*found, strict=True))


def pair_auc(scores, pairs: tuple[np.ndarray, np.ndarray, np.ndarray], block_weights: np.ndarray) -> np.ndarray:
    """AUC over given paid-vs-other pairs (ties count one half), each block's pairs weighted by its bootstrap
    weight [B, blocks]."""
    paid_row, other_row, block = pairs
    s_paid, s_other = scores[paid_row], scores[other_row]
    conc = (s_paid > s_other) + 0.5 * (s_paid == s_other)
    n_blocks = block_weights.shape[1]
    per_block = np.bincount(block, weights=conc, minlength=n_blocks)
    total = np.bincount(block, minlength=n_blocks).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (block_weights @ per_block) / (block_weights @ total)


def within_group_auc(conc: np.ndarray, total: np.ndarray, group_weights: np.ndarray) -> np.ndarray:
    """AUC over pairs inside the same group, from per-group counts and per-group weights [B, groups]."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return (group_weights * conc).sum(1) / (group_weights * total).sum(1)


def residualize(scores, covariate, groups) -> np.ndarray:
    """Scores minus their within-group linear dependence on a covariate (one slope, group fixed effects). A
    score that is the covariate itself leaves exactly zero."""
    _, inverse = np.unique(groups, return_inverse=True)
    counts = np.bincount(inverse)

    def demean(x):
        return x - (np.bincount(inverse, weights=x) / counts)[inverse]

    s, f = demean(scores.astype(float)), demean(covariate.astype(float))
    denom = (f * f).sum()
    slope = (s * f).sum() / denom if denom > 0 else 0.0
    return s - slope * f


# P-values against a random ordering of the rows (the permutation null: scores independent of the label). They
# need no bootstrap, so they hold for a handful of paid rollouts rows too, where a bootstrap interval collapses.


def _tail(z: float, side: str) -> float:
    """Normal tail: P(Z >= z) for side "greater", else two-sided."""
    if side == "greater":
        return 0.5 * math.erfc(z / math.sqrt(2))
    return math.erfc(abs(z) / math.sqrt(2))


def auroc_p_value(auc: float, scores, labels, side: str = "two-sided") -> float:
    """Mann-Whitney test of an AUROC against 0.5 (normal approximation, ties corrected)."""
    labels = np.asarray(labels) != 0
    n1, n0 = int(labels.sum()), int((~labels).sum())
    n = n1 + n0
    if not n1 or not n0 or not np.isfinite(auc):
        return float("nan")
    _, ties = np.unique(scores, return_counts=True)
    var_u = n1 * n0 / 12 * ((n + 1) - float((ties**3 - ties).sum()) / (n * (n - 1)))
    if var_u <= 0:  # every score tied: AUROC is exactly 0.5
        return 1.0
    return _tail((auc - 0.5) * n1 * n0 / math.sqrt(var_u), side)


def precision_p_value(precision: float, n: int, m: int, side: str = "two-sided") -> float:
    """Hypergeometric test of precision at n_paid: the paid rows among the top m of n rows when m of the n are paid
    and the top m are a random subset (exact for scores without ties). Two-sided: twice the smaller tail, at most 1."""
    if not 0 < m < n or not np.isfinite(precision):
        return float("nan")
    hits = int(round(precision * m))
    support = np.arange(max(0, 2 * m - n), m + 1)
    log_pmf = np.array([_log_choose(m, k) + _log_choose(n - m, m - k) - _log_choose(n, m) for k in support])
    pmf = np.exp(log_pmf - log_pmf.max())
    pmf /= pmf.sum()
    upper = float(pmf[support >= hits].sum())
    if side == "greater":
        return upper
    return min(1.0, 2 * min(upper, float(pmf[support <= hits].sum())))


def _log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
