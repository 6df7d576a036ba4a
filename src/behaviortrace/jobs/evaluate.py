"""Rules token_cosines and evaluate: every estimator's metrics for one seed and draw, per level and stratum."""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from behaviortrace.common.io import atomic_write_parquet
from behaviortrace.config.sections import TARGET_KINDS, Config
from behaviortrace.evaluate.cache import MetricCache, assemble, context_digest
from behaviortrace.evaluate.cells import evaluate, with_labels
from behaviortrace.evaluate.effect import measured_changes
from behaviortrace.evaluate.inputs import probe_rate_per_row, token_cosine_table, token_cosines_from_table
from behaviortrace.score.view import SeedView, Target

log = logging.getLogger(__name__)


def token_cosines_job(*, draw: int, shards: list[Path], rollouts: Path, target_store: Path, out: Path) -> None:
    """The behavior-token and null-position cosines of one seed and draw with every target kind: they read
    the large token sketches but no estimator's scores, so a change of an estimator does not redo them."""
    view = SeedView(shards, rollouts)
    targets = {kind: Target.load(target_store, kind, draw) for kind in TARGET_KINDS}
    table = token_cosine_table(view, targets)
    atomic_write_parquet(table, out)
    log.info("token cosines of %d rollouts with %s written to %s", table.height, ", ".join(targets), out)


def evaluate_job(
    cfg: Config,
    *,
    seed: int,
    draw: int,
    shards: list[Path],
    rollouts: Path,
    rates: Path,
    token_cosines: Path,
    step_log: Path,
    score_files: dict[tuple[str, str], tuple[Path, Path]],
    predicts_change: list[str],
    out: Path,
    cache_dir: Path | None = None,
) -> tuple[pl.DataFrame, int]:
    """Metrics of every (estimator, target) score set in `score_files` (rollout and step tables), and how
    many score sets came from the cache in `cache_dir` (evaluate/cache.py; None: no cache). The step log
    gives each step's measured change of the forced target (evaluate/effect.py); `predicts_change` names the
    estimators whose step scores predict it in its units."""
    evaluation, placebo = cfg.evaluation, cfg.planting.placebo
    view = SeedView(shards, rollouts)
    labelled = with_labels(view.rollouts, placebo)
    fluency = view.fluency
    changes = measured_changes(pl.read_parquet(step_log))
    predicts = frozenset(name for name, _ in score_files if name in predicts_change)
    cached, keys = {}, {}
    if cache_dir is not None:
        context = context_digest(
            {"config": cfg.to_dict(), "seed": seed, "draw": draw, "predicts_change": sorted(predicts)},
            [rollouts, rates, token_cosines, step_log],
            [view.rollouts["rollout_id"].to_numpy(), fluency],
        )
        cache = MetricCache(cache_dir, context)
        for name, files in score_files.items():
            keys[name] = cache.key(name, files)
            table = cache.load(name, keys[name])
            if table is not None:
                cached[name] = table
    scores = {key: (pl.read_parquet(r), pl.read_parquet(s)) for key, (r, s) in score_files.items() if key not in cached}
    log.info(
        "seed %d draw %d: %d rollouts, %d labelled (%s), %d score sets (%d from the cache)",
        seed,
        draw,
        labelled.height,
        int(labelled["label"].sum()),
        "eligible with the behavior, placebo" if placebo else "paid",
        len(score_files),
        len(cached),
    )
    fresh = evaluate(
        run=cfg.run,
        seed=seed,
        draw=draw,
        rollouts=labelled,
        fluency=fluency,
        probe_rate=probe_rate_per_row(view, pl.read_parquet(rates)),
        scores=scores,
        window=cfg.planting.window,
        saturation=cfg.targets.saturation,
        n_boot=evaluation.bootstrap,
        eval_seed=evaluation.seed,
        fluency_match=evaluation.fluency_match,
        min_matched_pairs=evaluation.min_matched_pairs,
        advantage_match=evaluation.advantage_match,
        permutations=evaluation.permutations,
        token=token_cosines_from_table(pl.read_parquet(token_cosines), view),
        changes=changes,
        predicts_change=predicts,
    )
    if cache_dir is not None:
        for name in scores:
            own = fresh.filter((pl.col("estimator") == name[0]) & (pl.col("target") == name[1]))
            cache.save(name, keys[name], own)
    table = assemble(fresh, cached, list(score_files))
    atomic_write_parquet(table, out)
    log.info("%d metric rows written to %s", table.height, out)
    return table, len(cached)
