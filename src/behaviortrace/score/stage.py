"""Rule score: one estimator's scores for one seed, draw and target kind."""

from __future__ import annotations

from pathlib import Path

from behaviortrace.common.io import atomic_write_parquet
from behaviortrace.config.sections import Config
from behaviortrace.score import contract
from behaviortrace.score.view import SeedView, Target


def score_job(
    cfg: Config,
    *,
    estimator: str,
    target: str,
    draw: int,
    shards: list[Path],
    rollouts: Path,
    target_store: Path | None,
    out_rollouts: Path,
    out_steps: Path,
) -> None:
    """Run `estimator` (its config entry from `cfg.estimators`) and write its rollout and step scores."""
    view = SeedView(shards, rollouts)
    tgt = Target.load(target_store, target, draw) if target != "none" else None
    roll, steps = contract.run(estimator, cfg.estimators[estimator], view, tgt)
    atomic_write_parquet(roll, out_rollouts)
    atomic_write_parquet(steps, out_steps)
