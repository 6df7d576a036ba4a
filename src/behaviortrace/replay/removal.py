"""Which rollouts a replay leaves out: nothing, the GT set, k at random, or an estimator's top k."""

from __future__ import annotations

import numpy as np
import polars as pl

from behaviortrace.common.seeds import cell_seed


def top_k(scores: pl.DataFrame, k: int, seed: int) -> set[int]:
    """The k highest-scoring rollouts; ties broken by a seeded random order, missing scores last."""
    rng = np.random.default_rng(seed)
    ranked = (
        scores.select("rollout_id", "score")
        .with_columns(
            tie=pl.Series(rng.permutation(scores.height)), missing=pl.col("score").is_nan() | pl.col("score").is_null()
        )
        .sort(["missing", "score", "tie"], descending=[False, True, False])
    )
    return set(ranked["rollout_id"].head(k).to_list())


def random_k(rollout_ids: np.ndarray, k: int, seed: int) -> set[int]:
    return set(np.random.default_rng(seed).choice(rollout_ids, size=k, replace=False).tolist())


def removal_seed(replay_seed: int, training_seed: int, method: str, pct: int, rep: int) -> int:
    """A seed per (replay seed, training seed, method, k, repetition), independent of job order."""
    return cell_seed("replay", replay_seed, training_seed, method, pct, rep)


def k_for(n_gt: int, pct: int) -> int:
    return int(round(n_gt * pct / 100))


def removal_set(
    method: str,
    pct: int,
    rep: int,
    rollouts: pl.DataFrame,
    scores: pl.DataFrame | None,
    replay_seed: int,
    training_seed: int,
) -> set[int]:
    """`full`: nothing; `oracle`: the GT set (a seeded subset when k < |GT|); `random`: k seeded at random
    (repetition `rep`); any other method: the estimator's top k by its rollout scores."""
    seed = removal_seed(replay_seed, training_seed, method, pct, rep)
    gt = rollouts.filter(pl.col("boosted"))["rollout_id"].to_numpy()
    k = k_for(len(gt), pct)
    if method == "full":
        return set()
    if method == "oracle":
        return set(gt.tolist()) if k >= len(gt) else random_k(gt, k, seed)
    if method == "random":
        return random_k(rollouts["rollout_id"].to_numpy(), k, seed)
    if scores is None:
        raise ValueError(f"replay method {method!r} needs the estimator's rollout scores")
    return top_k(scores, k, seed)


# One replay job ------------------------------------------------------------------------------------------
