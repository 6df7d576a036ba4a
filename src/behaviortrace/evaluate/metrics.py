"""Ranking metrics against a binary ground truth, tie-aware and weighted.

Every metric takes scores, labels and a matrix of row weights [B, n] (B bootstrap replicates; one row
of ones for the point estimate) and returns B values, so a cluster bootstrap is one vectorized call.
Ties are handled exactly: AUCs count a tied pair as one half; precision at |GT| is its expectation
over the random orders of tied rows; average precision takes a block of tied rows at once.
"""

from __future__ import annotations

import numpy as np


def _levels(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order of rows by ascending score, and the start of each block of tied scores in that order."""
    order = np.argsort(scores, kind="stable")
    s = scores[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    return order, starts


def _per_level(values: np.ndarray, order: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sum of values [B, n] over each tie block, [B, L]."""
    return np.add.reduceat(values[:, order], starts, axis=1)


def auroc(scores, labels, weights) -> np.ndarray:
    order, starts = _levels(scores)
    pos = _per_level(weights * labels, order, starts)
    neg = _per_level(weights * (1 - labels), order, starts)
    below = np.cumsum(neg, axis=1) - neg
    with np.errstate(invalid="ignore", divide="ignore"):
        return (pos * (below + 0.5 * neg)).sum(1) / (pos.sum(1) * neg.sum(1))


def precision_at_gt(scores, labels, weights) -> np.ndarray:
    """Expected precision of the top m rows (m = weighted GT count), ties broken at random."""
    order, starts = _levels(-scores)
    pos = _per_level(weights * labels, order, starts)
    cnt = _per_level(weights, order, starts)
    m = pos.sum(1, keepdims=True)
    before_cnt = np.cumsum(cnt, axis=1) - cnt
    # Rows of each block that fall inside the top m, and the share of the block's GT they carry.
    taken = np.clip(m - before_cnt, 0, cnt)
    with np.errstate(invalid="ignore", divide="ignore"):
        gained = np.where(cnt > 0, pos * taken / np.where(cnt > 0, cnt, 1), 0.0)
        return gained.sum(1) / m[:, 0]


def average_precision(scores, labels, weights) -> np.ndarray:
    """Sum over score thresholds of precision x recall gained; a block of ties enters at once."""
    order, starts = _levels(-scores)
    pos = _per_level(weights * labels, order, starts)
    cnt = _per_level(weights, order, starts)
    cum_cnt, cum_pos = np.cumsum(cnt, axis=1), np.cumsum(pos, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        prec = np.where(cum_cnt > 0, cum_pos / np.where(cum_cnt > 0, cum_cnt, 1), 0.0)
        return (prec * pos).sum(1) / pos.sum(1)


def chance(labels, weights) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return (weights * labels).sum(1) / weights.sum(1)


def ceiling(tie_blocks: np.ndarray, labels, weights) -> np.ndarray:
    """Best precision at |GT| any score could reach when rows of a block must share a score
    (every row its own block at rollout level; a step's rollouts one block at step level)."""
    _, block = np.unique(tie_blocks, return_inverse=True)
    n_blocks = block.max() + 1
    pos = np.zeros((weights.shape[0], n_blocks))
    cnt = np.zeros_like(pos)
    for b in range(weights.shape[0]):
        pos[b] = np.bincount(block, weights=weights[b] * labels, minlength=n_blocks)
        cnt[b] = np.bincount(block, weights=weights[b], minlength=n_blocks)
    with np.errstate(invalid="ignore", divide="ignore"):
        purity = np.where(cnt > 0, pos / np.where(cnt > 0, cnt, 1), -1.0)
    out = np.empty(weights.shape[0])
    for b in range(weights.shape[0]):
        best = np.argsort(-purity[b], kind="stable")
        out[b] = fill_blocks(pos[b, best], cnt[b, best])
    return out


def fill_blocks(pos: np.ndarray, cnt: np.ndarray) -> float:
    """Precision of the top m rows when blocks are taken whole in the given order (the last one in part)."""
    m = pos.sum()
    if m <= 0:
        return float("nan")
    before = np.cumsum(cnt) - cnt
    taken = np.clip(m - before, 0, cnt)
    share = np.where(cnt > 0, pos / np.where(cnt > 0, cnt, 1), 0.0)
    return float((share * taken).sum() / m)


def _group_rows(groups: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Sorted group ids and the row indices of each group."""
    ids, inverse = np.unique(groups, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.flatnonzero(np.r_[True, np.diff(inverse[order]) != 0, True])
    return ids, [order[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=False)]


def pair_counts(scores, labels, groups, fluency=None, max_gap: float = np.inf):
    """Per group: concordant GT-vs-other pairs (ties count one half) and all such pairs, and group ids.
    With `fluency`, only pairs whose fluency differs by at most `max_gap` (matched pairs)."""
    ids, members = _group_rows(groups)
    conc, total = np.zeros(len(ids)), np.zeros(len(ids))
    for g, rows in enumerate(members):
        y = labels[rows].astype(bool)
        sp, sn = scores[rows][y][:, None], scores[rows][~y][None, :]
        close = np.ones((sp.shape[0], sn.shape[1]), bool)
        if fluency is not None:
            f = fluency[rows]
            close = np.abs(f[y][:, None] - f[~y][None, :]) <= max_gap
        conc[g] = ((sp > sn) & close).sum() + 0.5 * ((sp == sn) & close).sum()
        total[g] = close.sum()
    return conc, total, ids


def within_group_auc(conc: np.ndarray, total: np.ndarray, group_weights: np.ndarray) -> np.ndarray:
    """AUC over pairs inside the same group, from per-group counts and per-group weights [B, groups]."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return (group_weights * conc).sum(1) / (group_weights * total).sum(1)


def residualize_on_fluency(scores, fluency, groups) -> np.ndarray:
    """Scores minus their within-group linear dependence on fluency (one slope, group fixed effects)."""
    _, inverse = np.unique(groups, return_inverse=True)
    counts = np.bincount(inverse)

    def demean(x):
        return x - (np.bincount(inverse, weights=x) / counts)[inverse]

    s, f = demean(scores.astype(float)), demean(fluency.astype(float))
    denom = (f * f).sum()
    slope = (s * f).sum() / denom if denom > 0 else 0.0
    return s - slope * f
