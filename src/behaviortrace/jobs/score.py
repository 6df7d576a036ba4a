"""Rules score, score_target_free and score_model: an estimator's per-seed preparation and its scores for one seed,
every draw and target kind."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from behaviortrace.common.io import atomic_write_parquet, scratch_dir
from behaviortrace.config.sections import Config
from behaviortrace.score import contract
from behaviortrace.score.view import SeedView, Target

log = logging.getLogger(__name__)


def score_job(
    cfg: Config,
    *,
    estimator: str,
    cells: list[tuple[int, str]],
    shards: list[Path],
    rollouts: Path,
    sketch_matrix: Path | None,
    sketch_gram: Path | None,
    target_stores: dict[int, Path],
    out_rollouts: list[Path],
    out_steps: list[Path],
) -> None:
    """Run `estimator` (its config entry from `cfg.estimators`) for each (draw, target kind) of `cells` (target kind
    "none": no target) and write its rollout and step scores to the matching output files.

    One job scores every cell of a seed, after the estimator's preparation (trak's factorization) made once for all
    of them: each job's imports and reads of the sketches cost about a second, more than scoring a cell. The seed's
    arrays are read once and shared by every cell (the view's arrays are read-only)."""
    started = time.time()
    view = SeedView(shards, rollouts, sketch_matrix, sketch_gram)
    params = cfg.estimators[estimator]
    ready = contract.prepare(estimator, params, view) if contract.Instance.of(estimator, params).prepares else None
    for (draw, target), out_roll, out_step in zip(cells, out_rollouts, out_steps, strict=True):
        tgt = Target.load(target_stores[draw], target, draw) if target != "none" else None
        roll, steps = contract.run(estimator, params, view, tgt, prepared=ready)
        atomic_write_parquet(roll, out_roll)
        atomic_write_parquet(steps, out_step)
    log.info(
        "%s: %d cells scored for %d rollouts in %.1f s",
        estimator,
        len(cells),
        view.rollouts.height,
        time.time() - started,
    )


def score_model_job(
    cfg: Config,
    *,
    estimator: str,
    cells: list[tuple[int, str]],
    rollouts: Path,
    checkpoints: Path,
    base_model: Path,
    target_stores: dict[int, Path],
    probes: Path,
    out_rollouts: list[Path],
    out_steps: list[Path],
) -> None:
    """Run an estimator that needs the model (score/model_run.py) for each (draw, target kind) of `cells` and write
    its rollout and step scores to the matching output files.

    One job scores every cell of a seed because each such job spends seconds importing torch, transformers and the
    estimator's library. The estimator's per-seed preparation (ekfac's factors, trackstar's rollout side) comes
    first, once, into the job's scratch folder beside the outputs (removed when the job ends, and by the next
    attempt where a killed one left it); each cell then gets its own ModelRun and scratch folder."""
    # Here, not at the top: the score jobs of this module read sketches and logs only, and importing torch and
    # transformers cost each of them seconds.
    from behaviortrace.common.job import settle
    from behaviortrace.score.model_run import ModelRun, ModelTarget

    params = cfg.estimators[estimator]
    instance = contract.Instance.of(estimator, params)
    settle(*instance.requires)  # the estimator's library (kronfluence, bergson, dattri)
    seed_folder = out_rollouts[0].parent
    with scratch_dir(seed_folder / ".scratch-prepared") as scratch:
        prepared = None
        if instance.prepares:
            started = time.time()
            run = ModelRun(cfg, rollouts, checkpoints, base_model, scratch)
            prepared = contract.prepare_model(estimator, params, run, scratch / "prepared")
            log.info("%s prepared for %d rollouts in %.1f s", estimator, run.rollouts.height, time.time() - started)
        for (draw, target), out_roll, out_step in zip(cells, out_rollouts, out_steps, strict=True):
            started = time.time()
            with scratch_dir(out_roll.parent / f".scratch-{out_roll.stem}") as cell_scratch:
                run = ModelRun(cfg, rollouts, checkpoints, base_model, cell_scratch)
                tgt = ModelTarget.load(cfg, target, draw, target_stores[draw], probes, run)
                roll, steps = contract.run(estimator, params, run, tgt, prepared=prepared)
            atomic_write_parquet(roll, out_roll)
            atomic_write_parquet(steps, out_step)
            log.info("%s: draw %d, %s target scored in %.1f s", estimator, draw, target, time.time() - started)
