"""Which rollouts a replay leaves out: nothing, the paid set, or an estimator's top-scored set; and the random
sets each is compared with, drawn step-matched to it.

Only rollouts of steps before the replay's last measured checkpoint can change what it measures, so the
top-scored sets are chosen among those, and a set's random comparisons take as many rollouts from each step as
the set does. A random set drawn from every step would mostly miss the measured steps, and any estimator whose
top-scored rollouts lie early would beat it on timing alone.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from behaviortrace.common.seeds import cell_seed
from behaviortrace.config.sections import Planting, Replay

RANDOM = "random"


def measured_steps(replay: Replay, planting: Planting, steps: int) -> dict[int, str]:
    """{steps done: checkpoint name} where a replay measures the behavior; it stops after the last."""
    measured = {steps: "final"} if "final" in replay.measure_at else {}
    if "window_end" in replay.measure_at:
        measured[planting.end_checkpoint(steps)] = "window_end"
    return measured


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


# The name a removal's seeds are drawn from: the label set keeps the name it had before issue 54 renamed it, so that
# it and its random comparisons draw the rollouts they drew before the rename.
SEED_SALT = {"label": "oracle"}


def removal_seed(replay_seed: int, training_seed: int, removal: str, pct: int, rep: int) -> int:
    """A seed per (replay seed, training seed, removal, k, repetition), independent of job order."""
    name = "~".join(SEED_SALT.get(part, part) for part in removal.split("~"))  # random~label: the sets matched to it
    return cell_seed("replay", replay_seed, training_seed, name, pct, rep)


def removal_size(n_paid: int, pct: int) -> int:
    return int(round(n_paid * pct / 100))


def removal_set(
    removal: str,
    pct: int,
    rollouts: pl.DataFrame,
    scores: pl.DataFrame | None,
    replay_seed: int,
    training_seed: int,
    end: int | None = None,
) -> set[int]:
    """`full`: nothing; `label`: the paid set (a seeded subset when k < n_paid); any other removal: the
    estimator's top-scored set among the rollouts of steps before `end` (the replay's last measured checkpoint).
    k is `pct` percent of n_paid."""
    if removal == "full":
        return set()
    seed = removal_seed(replay_seed, training_seed, removal, pct, 0)
    paid = rollouts.filter(pl.col("paid"))["rollout_id"].to_numpy()
    k = removal_size(len(paid), pct)
    if removal == "label":
        return set(paid.tolist()) if k >= len(paid) else random_set(paid, k, seed)
    if scores is None or end is None:
        raise ValueError(f"replay removal {removal!r} needs the estimator's rollout scores and the replay's end")
    before = rollouts.filter(pl.col("step") < end)["rollout_id"]
    return top_scored(scores.filter(pl.col("rollout_id").is_in(before.implode())), k, seed)


def step_matched(rollouts: pl.DataFrame, removed: set[int], seed: int) -> set[int]:
    """As many rollouts drawn at random from each step as `removed` holds there: the comparison that shares the
    set's timing and differs only in which rollouts of those steps it picks."""
    rng = np.random.default_rng(seed)
    table = rollouts.select("step", "rollout_id").sort("step", "rollout_id")
    counts = table.filter(pl.col("rollout_id").is_in(sorted(removed))).group_by("step").len().sort("step")
    out: set[int] = set()
    for step, n in counts.iter_rows():
        ids = table.filter(pl.col("step") == step)["rollout_id"].to_numpy()
        out |= set(rng.choice(ids, size=n, replace=False).tolist())
    return out


def random_comparisons(
    removal: str,
    removed: set[int],
    pct: int,
    repeats: int,
    rollouts: pl.DataFrame,
    replay_seed: int,
    training_seed: int,
) -> list[set[int]]:
    """`repeats` random sets step-matched to `removal`'s set, each seeded by its repetition."""
    return [
        step_matched(rollouts, removed, removal_seed(replay_seed, training_seed, f"{RANDOM}~{removal}", pct, rep))
        for rep in range(repeats)
    ]
