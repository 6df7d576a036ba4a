"""The rollout sets the retrain job removes (weight 0): random subsets of rollouts or groups for the LDS, each
step's rollouts (leave-one-step-out), and the leave-out replay's own sets (the paid set, each replayed
estimator's top-scored set) for the predicted-vs-measured comparison; each under one meaning of removal
(`influence.semantics`, trajectory.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from behaviortrace.common.seeds import cell_seed
from behaviortrace.config.sections import Config

# The meanings of removing (or weighting) a rollout (influence.semantics): here, where the jobs that only plan or
# read sets find them without importing torch.
SEMANTICS = ("advantages", "held")


def units(rollouts: pl.DataFrame, level: str) -> list[list[int]]:
    """The units an LDS subset is drawn from, as lists of rollout ids: each rollout alone (level rollout), or
    each group (level group), in rollout-id order. Removing a whole group through the advantages is exactly "this
    prompt was never sampled" (its tokens leave the normalization too); with advantages held it is not (they stay)."""
    rollouts = rollouts.sort("rollout_id")
    if level == "rollout":
        return [[int(z)] for z in rollouts["rollout_id"]]
    groups = rollouts.group_by("step", "group_id", maintain_order=True).agg("rollout_id")
    return [list(map(int, ids)) for ids in groups["rollout_id"]]


def lds_subsets(units_: list[list[int]], n: int, percent: int, seed: int, arm: str, training_seed: int, level: str):
    """`n` seeded random subsets, each `percent` % of the units (at least one), as sets of rollout ids."""
    size = max(1, int(round(percent / 100 * len(units_))))
    out = []
    for j in range(n):
        rng = np.random.default_rng(cell_seed("influence_lds", seed, arm, training_seed, level, percent, j))
        out.append({z for u in rng.choice(len(units_), size=size, replace=False) for z in units_[u]})
    return out


def step_sets(rollouts: pl.DataFrame, end: int) -> list[set[int]]:
    """Leave-one-step-out: every rollout of step s, for each step s before `end`."""
    return [set(rollouts.filter(pl.col("step") == s)["rollout_id"].to_list()) for s in range(end)]


def fd_steps(steps: np.ndarray, n: int, seed: int, arm: str, training_seed: int) -> list[int]:
    """`n` distinct steps (seeded) among `steps`, sorted: where the finite-difference check takes a rollout."""
    choices = np.unique(steps)
    rng = np.random.default_rng(cell_seed("influence_fd", seed, arm, training_seed))
    return sorted(rng.choice(choices, size=min(n, len(choices)), replace=False).tolist())


@dataclass(frozen=True)
class Zeroed:
    """A set of rollouts retrained with their weights 0 under `semantics`: kind `lds` (a random subset of `level`
    units, `percent` % of them), `step` (leave-one-step-out: index is the step) or a leave-out replay removal
    (`label` or an estimator's top-scored set, `percent` its removal percent)."""

    kind: str
    level: str
    percent: int
    index: int
    removed: set[int]
    semantics: str


def zeroed_table(sets: list[Zeroed], values: list[float]) -> pl.DataFrame:
    """One row per retrained set: kind, level, removal_percent, index, the removed ids, the semantics of removal,
    and f after retraining."""
    return pl.DataFrame(
        {
            "kind": [s.kind for s in sets],
            "level": [s.level for s in sets],
            "removal_percent": [s.percent for s in sets],
            "index": [s.index for s in sets],
            "n_removed": [len(s.removed) for s in sets],
            "removed_ids": [sorted(s.removed) for s in sets],
            "semantics": pl.Series([s.semantics for s in sets], dtype=pl.String),
            "f": values,
        },
        schema_overrides={"removed_ids": pl.List(pl.Int64), "removal_percent": pl.Int64, "index": pl.Int64},
    )


def retrained_sets(
    cfg: Config, rollouts: pl.DataFrame, end: int, arm: str, seed: int, label_percents, replay_seed: int
) -> list[Zeroed]:
    """What the influence job retrains: the LDS subsets of the rollouts before T at every level and percent (under
    the configured semantics, and the other one too with `influence.lds_both_semantics`), each step's rollouts
    (leave-one-step-out, if configured: removing a whole step is the same under both), and the leave-out replay's
    paid sets (drawn from every rollout, as the replay draws them)."""
    from behaviortrace.replay.removal import removal_set

    inf = cfg.influence
    before = rollouts.filter(pl.col("step") < end)
    meanings = [inf.semantics] + ([s for s in SEMANTICS if s != inf.semantics] if inf.lds_both_semantics else [])
    out = []
    for semantics in meanings:
        for level in inf.lds_levels:
            of = units(before, level)
            for pct in inf.lds_percents:
                subsets = lds_subsets(of, inf.lds_subsets, pct, inf.seed, arm, seed, level)
                out += [Zeroed("lds", level, pct, j, s, semantics) for j, s in enumerate(subsets)]
    if inf.leave_step_out:
        out += [Zeroed("step", "step", 100, step, s, inf.semantics) for step, s in enumerate(step_sets(before, end))]
    out += [
        Zeroed("label", "rollout", pct, 0, removal_set("label", pct, rollouts, None, replay_seed, seed), inf.semantics)
        for pct in label_percents
    ]
    return out
