"""The vectorized metrics (cluster weights, merged tie levels, blocked pair counts) against independent
brute-force computations on small random data: ties, zero-weight rows, uneven groups, several replicates."""

import itertools
import math

import numpy as np
import pytest

from behaviortrace.evaluate import metrics as M

TOL = dict(rtol=1e-12, atol=1e-12)


def random_case(rng, n_groups=6, max_size=5, levels=4, n_boot=4):
    """Scores with ties, labels, groups of uneven size, and cluster (group) bootstrap weights with zeros."""
    sizes = rng.integers(1, max_size + 1, n_groups)
    groups = np.repeat(rng.permutation(100)[:n_groups] * 7, sizes)  # unsorted, non-contiguous ids
    rows = rng.permutation(len(groups))  # rows of a group are not adjacent
    groups = groups[rows]
    n = len(groups)
    scores = rng.integers(0, levels, n).astype(float)
    labels = (rng.random(n) < 0.4).astype(float)
    labels[:2] = [1, 0]
    _, cluster = np.unique(groups, return_inverse=True)
    by_cluster = rng.integers(0, 3, (n_groups, n_boot)).astype(float)
    by_cluster[:, 0] = 1  # the point estimate
    return scores, labels, groups, M.Weights(by_cluster, cluster)


def row_matrix(w: M.Weights) -> np.ndarray:
    return w.by_cluster[w.cluster].T  # [B, n]


def brute_auc(scores, labels, pair_weight):
    """Weighted share of paid-vs-other pairs ordered right (a tie counts one half), pair by pair."""
    num = den = 0.0
    for i, j in itertools.product(range(len(scores)), repeat=2):
        if labels[i] == 1 and labels[j] == 0:
            den += pair_weight(i, j)
            num += pair_weight(i, j) * (1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0)
    return num / den if den else np.nan


def brute_average_precision(scores, labels, weights):
    ap, total_pos = 0.0, (weights * labels).sum()
    for t in sorted(set(scores), reverse=True):
        at, above = scores == t, scores >= t
        if weights[above].sum() > 0:
            recall_gained = (weights[at] * labels[at]).sum() / total_pos
            ap += recall_gained * (weights[above] * labels[above]).sum() / weights[above].sum()
    return ap


def brute_precision(scores, labels, counts):
    """Mean precision of the top n_paid over every order of tied rows, each row repeated `counts` times."""
    s, y = np.repeat(scores, counts.astype(int)), np.repeat(labels, counts.astype(int))
    m = int(y.sum())
    blocks = [list(np.flatnonzero(s == t)) for t in sorted(set(s), reverse=True)]
    total = count = 0
    for orders in itertools.product(*(itertools.permutations(b) for b in blocks)):
        ranking = [i for block in orders for i in block]
        total += y[ranking[:m]].sum() / m
        count += 1
    return total / count


def brute_ceiling(blocks, labels, weights):
    """Best, over every order of whole blocks, of the expected precision of the top n_paid (ties at random)."""
    ids = np.unique(blocks)
    pos = np.array([(weights * labels)[blocks == b].sum() for b in ids])
    cnt = np.array([weights[blocks == b].sum() for b in ids])
    m = pos.sum()
    best = -np.inf
    for order in itertools.permutations(range(len(ids))):
        left, got = m, 0.0
        for k in order:
            take = min(max(left, 0.0), cnt[k])
            got += pos[k] * take / cnt[k] if cnt[k] > 0 else 0.0
            left -= cnt[k]
        best = max(best, got / m)
    return best


@pytest.mark.parametrize("seed", range(10))
def test_ranking_metrics_match_brute_force_for_every_replicate(seed):
    rng = np.random.default_rng(seed)
    scores, labels, _, w = random_case(rng)
    rows = row_matrix(w)
    got = M.ranking_metrics(scores, labels, w)
    for name, fn in [
        ("auroc", M.auroc),
        ("average_precision", M.average_precision),
        ("precision_at_paid", M.precision_at_paid),
    ]:
        # One computation for all three, the separate functions, and a plain row-weight matrix all agree.
        np.testing.assert_allclose(fn(scores, labels, w), got[name], **TOL)
        np.testing.assert_allclose(fn(scores, labels, rows), got[name], **TOL)
    for b in range(rows.shape[0]):
        brute = brute_auc(scores, labels, lambda i, j, b=b: rows[b, i] * rows[b, j])
        np.testing.assert_allclose(got["auroc"][b], brute, **TOL)
        np.testing.assert_allclose(got["average_precision"][b], brute_average_precision(scores, labels, rows[b]), **TOL)
    chance = [(rows[b] * labels).sum() / rows[b].sum() for b in range(rows.shape[0])]
    np.testing.assert_allclose(M.chance(labels, w), chance, **TOL)


@pytest.mark.parametrize("seed", range(12))
def test_precision_at_paid_is_the_mean_over_tie_orders_with_zero_weights(seed):
    rng = np.random.default_rng(seed)
    while True:  # small enough to enumerate every order of tied rows
        scores = rng.integers(0, 3, 7).astype(float)
        labels = (rng.random(7) < 0.4).astype(float)
        counts = rng.integers(0, 3, 7).astype(float)
        s = np.repeat(scores, counts.astype(int))
        orders = math.prod(math.factorial(int((s == t).sum())) for t in set(s))
        if (counts * labels).sum() > 0 and orders <= 20_000:
            break
    weights = np.vstack([np.ones(7), counts])
    got = M.precision_at_paid(scores, labels, weights)
    np.testing.assert_allclose(
        got, [brute_precision(scores, labels, np.ones(7)), brute_precision(scores, labels, counts)], **TOL
    )


@pytest.mark.parametrize("matched", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_within_group_and_matched_pair_auc_with_uneven_groups(seed, matched):
    rng = np.random.default_rng(seed)
    scores, labels, groups, w = random_case(rng, n_groups=7, max_size=6)
    fluency = np.round(rng.normal(0, 0.1, len(scores)), 2)
    conc, total, ids = M.pair_counts(scores, labels, groups, fluency if matched else None, 0.1)
    np.testing.assert_array_equal(ids, np.unique(groups))
    gw = w.by_cluster.T  # [B, groups], in the order of ids
    group_w = dict(zip(ids, w.by_cluster, strict=True))

    def pair_weight(i, j, b):
        """A pair inside a group counts with the group's weight (the bootstrap draws whole groups)."""
        close = not matched or abs(fluency[i] - fluency[j]) <= 0.1
        return group_w[groups[i]][b] * (groups[i] == groups[j] and close)

    for k, g in enumerate(ids):  # replicate 0 weighs every group 1: its pair weights are the pairs counted
        rows = np.flatnonzero(groups == g)
        pairs = [(i, j) for i in rows for j in rows if labels[i] == 1 and labels[j] == 0 and pair_weight(i, j, 0)]
        assert total[k] == len(pairs)
        assert conc[k] == sum(
            1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0 for i, j in pairs
        )
    auc = M.within_group_auc(conc, total, gw)
    for b in range(len(auc)):
        brute = brute_auc(scores, labels, lambda i, j, b=b: pair_weight(i, j, b))
        np.testing.assert_allclose(auc[b], brute, **TOL)


@pytest.mark.parametrize("seed", range(8))
def test_ceiling_matches_every_order_of_blocks(seed):
    rng = np.random.default_rng(seed)
    # Blocks spanning clusters (steps of several groups), and blocks within clusters (every row its own, and
    # parts of groups), where blocks of equal purity are merged before sorting.
    for n_groups, max_size, brute in [(3, 2, True), (8, 6, False)]:
        scores, labels, groups, w = random_case(rng, n_groups=n_groups, max_size=max_size)
        rows = row_matrix(w)
        spanning = (groups // 7) % 3
        parts = groups * 2 + (rng.random(len(groups)) < 0.5)
        for blocks in [spanning, np.arange(len(groups)), parts]:
            got = M.ceiling(blocks, labels, w)
            # As a row matrix, each row is its own cluster: parts of groups then span clusters (no merging).
            np.testing.assert_allclose(got, M.ceiling(blocks, labels, rows), **TOL)
            for b in range(rows.shape[0] if brute else 0):
                if (rows[b] * labels).sum() > 0:
                    np.testing.assert_allclose(got[b], brute_ceiling(blocks, labels, rows[b]), **TOL)
                else:
                    assert np.isnan(got[b])


def test_weights_sums_and_nan_scores():
    rng = np.random.default_rng(0)
    scores, labels, _, w = random_case(rng)
    rows = row_matrix(w)
    segment = rng.integers(0, 4, len(scores))
    values = rng.normal(size=len(scores))
    dense = np.stack([(rows * values * (segment == k)).sum(1) for k in range(5)])
    np.testing.assert_allclose(w.sums(values, segment, 5), dense, **TOL)
    np.testing.assert_allclose(w.take(segment == 1).sums(values[segment == 1])[0], dense[1], **TOL)
    # NaN scores sort last both ways, so the descending order is not the ascending one reversed.
    scores[[0, 3]] = np.nan
    got = M.ranking_metrics(scores, labels, w)
    np.testing.assert_allclose(got["precision_at_paid"], M.precision_at_paid(scores, labels, w), **TOL)
    np.testing.assert_allclose(got["average_precision"], M.average_precision(scores, labels, w), **TOL)
    np.testing.assert_allclose(got["auroc"], M.auroc(scores, labels, w), **TOL)
