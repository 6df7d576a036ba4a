"""The rollout sets whose shares the retrain job zeroes: random subsets for the LDS, and the leave-out
replay's own sets (the paid set, each replayed estimator's top-scored set) for the predicted-vs-measured comparison."""

from __future__ import annotations

import numpy as np
import polars as pl

from behaviortrace.common.seeds import cell_seed


def lds_subsets(rollout_ids: np.ndarray, n: int, fraction: float, seed: int, arm: str, training_seed: int):
    """`n` seeded random subsets, each `fraction` of `rollout_ids` (at least one rollout), independent of order."""
    size = max(1, int(round(fraction * len(rollout_ids))))
    ids = np.sort(np.asarray(rollout_ids))
    out = []
    for j in range(n):
        rng = np.random.default_rng(cell_seed("influence_lds", seed, arm, training_seed, j))
        out.append(set(rng.choice(ids, size=size, replace=False).tolist()))
    return out


def fd_steps(steps: np.ndarray, n: int, seed: int, arm: str, training_seed: int) -> list[int]:
    """`n` distinct steps (seeded) among `steps`, sorted: where the finite-difference check takes a rollout."""
    choices = np.unique(steps)
    rng = np.random.default_rng(cell_seed("influence_fd", seed, arm, training_seed))
    return sorted(rng.choice(choices, size=min(n, len(choices)), replace=False).tolist())


def zeroed_table(sets: list[tuple[str, int, int, set[int]]], values: list[float]) -> pl.DataFrame:
    """One row per retrained set: kind (lds, or a leave-out replay removal), removal_percent, index, removed ids, f."""
    return pl.DataFrame(
        {
            "kind": [s[0] for s in sets],
            "removal_percent": [s[1] for s in sets],
            "index": [s[2] for s in sets],
            "n_removed": [len(s[3]) for s in sets],
            "removed_ids": [sorted(s[3]) for s in sets],
            "f": values,
        },
        schema_overrides={"removed_ids": pl.List(pl.Int64)},
    )
