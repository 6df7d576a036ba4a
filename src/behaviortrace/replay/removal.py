"""Which rollouts a replay leaves out: nothing, the paid set, k at random, or an estimator's top-scored set."""

from __future__ import annotations

import numpy as np
import polars as pl

from behaviortrace.common.seeds import cell_seed


def top_scored(scores: pl.DataFrame, k: int, seed: int) -> set[int]:
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


def random_set(rollout_ids: np.ndarray, k: int, seed: int) -> set[int]:
    return set(np.random.default_rng(seed).choice(rollout_ids, size=k, replace=False).tolist())


def removal_seed(replay_seed: int, training_seed: int, removal: str, pct: int, rep: int) -> int:
    """A seed per (replay seed, training seed, removal, k, repetition), independent of job order."""
    return cell_seed("replay", replay_seed, training_seed, removal, pct, rep)


def removal_size(n_paid: int, pct: int) -> int:
    return int(round(n_paid * pct / 100))


def removal_set(
    removal: str,
    pct: int,
    rep: int,
    rollouts: pl.DataFrame,
    scores: pl.DataFrame | None,
    replay_seed: int,
    training_seed: int,
) -> set[int]:
    """`full`: nothing; `oracle`: the paid set (a seeded subset when k < n_paid); `random`: k seeded at random
    (repetition `rep`); any other removal: the estimator's top-scored set by its rollout scores."""
    seed = removal_seed(replay_seed, training_seed, removal, pct, rep)
    paid = rollouts.filter(pl.col("paid"))["rollout_id"].to_numpy()
    k = removal_size(len(paid), pct)
    if removal == "full":
        return set()
    if removal == "oracle":
        return set(paid.tolist()) if k >= len(paid) else random_set(paid, k, seed)
    if removal == "random":
        return random_set(rollouts["rollout_id"].to_numpy(), k, seed)
    if scores is None:
        raise ValueError(f"replay removal {removal!r} needs the estimator's rollout scores")
    return top_scored(scores, k, seed)


# One replay job ------------------------------------------------------------------------------------------
