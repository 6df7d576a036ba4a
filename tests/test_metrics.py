"""Every metric against a brute-force implementation on random inputs with ties, and hand-made cases."""

import itertools

import numpy as np
import pytest

from behaviortrace.evaluate import metrics as M


def random_case(rng, n=40, levels=5, groups=5):
    scores = rng.integers(0, levels, n).astype(float)  # few levels: many ties
    labels = (rng.random(n) < 0.35).astype(float)
    labels[:2] = [1, 0]
    return scores, labels, rng.integers(0, groups, n)


def brute_auc(scores, labels, pairs_ok=lambda i, j: True):
    num = den = 0.0
    for i in range(len(scores)):
        for j in range(len(scores)):
            if labels[i] == 1 and labels[j] == 0 and pairs_ok(i, j):
                den += 1
                num += 1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0
    return num / den


def brute_precision(scores, labels):
    """Average precision of the top n_paid over every ordering of tied rows (each block of ties permuted)."""
    m = int(labels.sum())
    blocks = [list(np.flatnonzero(scores == t)) for t in sorted(set(scores), reverse=True)]
    total = count = 0
    for orders in itertools.product(*(itertools.permutations(b) for b in blocks)):
        ranking = [i for block in orders for i in block]
        total += labels[ranking[:m]].sum() / m
        count += 1
    return total / count


def brute_average_precision(scores, labels):
    ap, p = 0.0, labels.sum()
    for t in sorted(set(scores), reverse=True):
        at = scores == t
        above = scores >= t
        ap += (labels[at].sum() / p) * (labels[above].sum() / above.sum())
    return ap


def replicate(x, counts):
    return np.repeat(x, counts.astype(int))


@pytest.mark.parametrize("seed", range(5))
def test_auroc_and_average_precision_match_brute_force_with_ties_and_weights(seed):
    rng = np.random.default_rng(seed)
    scores, labels, _ = random_case(rng)
    counts = rng.integers(0, 3, len(scores)).astype(float)
    counts[:2] = 1
    w = np.vstack([np.ones(len(scores)), counts])
    got = M.auroc(scores, labels, w)
    assert got[0] == pytest.approx(brute_auc(scores, labels))
    assert got[1] == pytest.approx(brute_auc(replicate(scores, counts), replicate(labels, counts)))
    ap = M.average_precision(scores, labels, w)
    assert ap[0] == pytest.approx(brute_average_precision(scores, labels))
    assert ap[1] == pytest.approx(brute_average_precision(replicate(scores, counts), replicate(labels, counts)))


@pytest.mark.parametrize("seed", range(8))
def test_precision_at_paid_is_the_mean_over_all_tie_orders(seed):
    rng = np.random.default_rng(seed)
    scores, labels, _ = random_case(rng, n=8, levels=3)
    assert M.precision_at_paid(scores, labels, np.ones((1, 8)))[0] == pytest.approx(brute_precision(scores, labels))
    counts = rng.integers(1, 3, 8).astype(float)
    rs, rl = replicate(scores, counts), replicate(labels, counts)
    if len(rs) <= 12:
        assert M.precision_at_paid(scores, labels, counts[None])[0] == pytest.approx(brute_precision(rs, rl))


@pytest.mark.parametrize("seed", range(5))
def test_within_group_and_matched_pair_auc_match_double_loops(seed):
    rng = np.random.default_rng(seed)
    scores, labels, groups = random_case(rng)
    fluency = rng.normal(0, 0.1, len(scores))
    conc, total, ids = M.pair_counts(scores, labels, groups)
    assert M.within_group_auc(conc, total, np.ones((1, len(ids))))[0] == pytest.approx(
        brute_auc(scores, labels, lambda i, j: groups[i] == groups[j])
    )
    # A group drawn twice by the bootstrap is two groups: pairs never cross copies.
    gw = rng.integers(0, 3, len(ids)).astype(float)
    gw[0] = 1
    copies = [(g, c) for g, w in zip(ids, gw, strict=False) for c in range(int(w))]
    rs = np.concatenate([scores[groups == g] for g, _ in copies])
    rl = np.concatenate([labels[groups == g] for g, _ in copies])
    rg = np.concatenate([np.full((groups == g).sum(), k) for k, (g, _) in enumerate(copies)])
    brute = brute_auc(rs, rl, lambda i, j: rg[i] == rg[j])
    assert M.within_group_auc(conc, total, gw[None])[0] == pytest.approx(brute)
    conc, total, ids = M.pair_counts(scores, labels, groups, fluency, 0.1)
    assert M.within_group_auc(conc, total, np.ones((1, len(ids))))[0] == pytest.approx(
        brute_auc(scores, labels, lambda i, j: groups[i] == groups[j] and abs(fluency[i] - fluency[j]) <= 0.1)
    )


def test_hand_made_ties_and_ceiling():
    labels = np.array([1, 1, 0, 1, 0, 0, 0, 0, 0, 0], float)
    ones = np.ones((1, 10))
    tied = np.zeros(10)
    assert M.auroc(tied, labels, ones)[0] == 0.5
    assert M.precision_at_paid(tied, labels, ones)[0] == pytest.approx(0.3)  # all tied: chance
    assert M.chance(labels, ones)[0] == pytest.approx(0.3)
    perfect = labels.copy()
    assert M.precision_at_paid(perfect, labels, ones)[0] == 1.0 and M.auroc(perfect, labels, ones)[0] == 1.0
    # Blocks (steps): A = rows 0-1 (2 paid of 2), B = rows 2-5 (1 of 4), C = rows 6-9 (0 of 4).
    blocks = np.array([0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    labels_b = np.array([1, 1, 0, 1, 0, 0, 0, 0, 0, 0], float)
    # Best: all of A, then one row of B at random: (2 + 1/4) / 3.
    assert M.ceiling(blocks, labels_b, ones)[0] == pytest.approx(0.75)
    assert M.ceiling(np.arange(10), labels_b, ones)[0] == 1.0
    # Step scores ranking B first: the top 3 rows are 3 of B's 4 (1 paid rollouts among them), 0.75 paid expected.
    step_scores = np.array([1, 1, 2, 2, 2, 2, 0, 0, 0, 0], float)
    assert M.precision_at_paid(step_scores, labels_b, ones)[0] == pytest.approx(0.25)


def test_residualizing_removes_a_pure_fluency_signal():
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(50), 8)
    labels = (rng.random(400) < 0.3).astype(float)
    fluency = rng.normal(0, 1, 400) + labels  # paid rollouts are more fluent
    conc, total, _ = M.pair_counts(fluency, labels, groups)
    raw = M.within_group_auc(conc, total, np.ones((1, 50)))[0]
    resid = M.residualize(fluency, fluency, groups)
    conc, total, _ = M.pair_counts(np.round(resid, 9), labels, groups)
    assert raw > 0.7
    assert M.within_group_auc(conc, total, np.ones((1, 50)))[0] == pytest.approx(0.5)
    # A real signal beyond fluency survives.
    score = fluency + 2 * labels
    resid = M.residualize(score, fluency, groups)
    conc, total, _ = M.pair_counts(resid, labels, groups)
    assert M.within_group_auc(conc, total, np.ones((1, 50)))[0] > 0.85


def test_effect_bootstrap_resamples_whole_blocks_of_consecutive_steps():
    from behaviortrace.evaluate.effect import block_resamples

    n = 50  # blocks of 8 steps
    draws = block_resamples(n, 200, seed=3)
    assert draws.shape == (200, n) and draws.min() >= 0 and draws.max() < n
    assert np.array_equal(draws, block_resamples(n, 200, seed=3))
    for row in draws[:20]:
        for start in range(0, n, 8):
            block = row[start : start + 8]
            assert np.array_equal(block, (block[0] + np.arange(len(block))) % n)
    # Every step is drawn about equally often (circular blocks have no edge effect).
    counts = np.bincount(draws.ravel(), minlength=n)
    assert counts.min() > 0.7 * counts.mean() and counts.max() < 1.3 * counts.mean()
