"""Rules prepare, prepare_model, score and score_model: an estimator's per-seed preparation, and its scores for one
seed, draw and target kind (score_model: for every draw and target kind of one seed)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from behaviortrace.common.io import atomic_write_parquet, scratch_dir
from behaviortrace.config.sections import Config
from behaviortrace.score import contract
from behaviortrace.score.view import SeedView, Target

log = logging.getLogger(__name__)


def prepare_job(
    cfg: Config,
    *,
    estimator: str,
    shards: list[Path],
    rollouts: Path,
    sketch_matrix: Path,
    sketch_gram: Path,
    out: Path,
) -> None:
    """Run `estimator`'s prepare function once for the seed and save what it returns."""
    started = time.time()
    view = SeedView(shards, rollouts, sketch_matrix, sketch_gram)
    prepared = contract.prepare(estimator, cfg.estimators[estimator], view)
    contract.save_prepared(prepared, out)
    log.info("%s prepared for %d rollouts in %.1f s: %s", estimator, view.rollouts.height, time.time() - started, out)


def score_job(
    cfg: Config,
    *,
    estimator: str,
    target: str,
    draw: int,
    shards: list[Path],
    rollouts: Path,
    sketch_matrix: Path | None,
    prepared: Path | None,
    target_store: Path | None,
    out_rollouts: Path,
    out_steps: Path,
) -> None:
    """Run `estimator` (its config entry from `cfg.estimators`) and write its rollout and step scores."""
    view = SeedView(shards, rollouts, sketch_matrix)
    tgt = Target.load(target_store, target, draw) if target != "none" else None
    ready = contract.load_prepared(prepared) if prepared is not None else None
    roll, steps = contract.run(estimator, cfg.estimators[estimator], view, tgt, prepared=ready)
    atomic_write_parquet(roll, out_rollouts)
    atomic_write_parquet(steps, out_steps)


def prepare_model_job(
    cfg: Config, *, estimator: str, rollouts: Path, checkpoints: Path, base_model: Path, out: Path
) -> None:
    """Run the per-seed preparation of an estimator that needs the model into the folder `out`, written beside it
    and renamed when complete."""
    from behaviortrace.common.io import replace_dir
    from behaviortrace.score.model_run import ModelRun

    started = time.time()
    with scratch_dir(out.parent / f".scratch-{out.name}") as scratch:
        run = ModelRun(cfg, rollouts, checkpoints, base_model, scratch)
        folder = contract.prepare_model(estimator, cfg.estimators[estimator], run, scratch / "prepared")
        replace_dir(folder, out)
    log.info("%s prepared for %d rollouts in %.1f s: %s", estimator, run.rollouts.height, time.time() - started, out)


def score_model_job(
    cfg: Config,
    *,
    estimator: str,
    cells: list[tuple[int, str]],
    rollouts: Path,
    checkpoints: Path,
    base_model: Path,
    prepared: Path | None,
    target_stores: dict[int, Path],
    probes: Path,
    out_rollouts: list[Path],
    out_steps: list[Path],
) -> None:
    """Run an estimator that needs the model (score/model_run.py) for each (draw, target kind) of `cells` and write
    its rollout and step scores to the matching output files.

    One job scores every cell of a seed because each such job spends seconds importing torch, transformers and the
    estimator's library. Each cell gets its own ModelRun and scratch folder, as when each had its own job, so its
    scores are the same; a library's files go to a scratch folder beside the outputs, removed when the cell ends
    (and by the next attempt, where a killed one left it)."""
    # Here, not at the top: the score and prepare jobs of this module read sketches and logs only, and importing
    # torch and transformers cost each of them seconds.
    from behaviortrace.score.model_run import ModelRun, ModelTarget

    for (draw, target), out_roll, out_step in zip(cells, out_rollouts, out_steps, strict=True):
        started = time.time()
        with scratch_dir(out_roll.parent / f".scratch-{out_roll.stem}") as scratch:
            run = ModelRun(cfg, rollouts, checkpoints, base_model, scratch)
            tgt = ModelTarget.load(cfg, target, draw, target_stores[draw], probes, run)
            roll, steps = contract.run(estimator, cfg.estimators[estimator], run, tgt, prepared=prepared)
        atomic_write_parquet(roll, out_roll)
        atomic_write_parquet(steps, out_step)
        log.info("%s: draw %d, %s target scored in %.1f s", estimator, draw, target, time.time() - started)
