"""Rules replay and replay_table: retrain one seed with a set of rollouts left out (and with the random sets it
is compared with), and tabulate them all.

torch, transformers and the retraining code are imported inside `Replays` only, so the table job
does not spend seconds importing them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from behaviortrace.common.io import atomic_write_parquet
from behaviortrace.common.markdown import write_md_and_html
from behaviortrace.config.sections import Config
from behaviortrace.replay.removal import RANDOM, measured_steps, random_comparisons, removal_set, removal_size
from behaviortrace.replay.replays import Replays
from behaviortrace.replay.table import replay_table, to_markdown

log = logging.getLogger(__name__)


def replay_job(
    cfg: Config,
    *,
    seed: int,
    removal: str,
    pct: int,
    rollouts_path: Path,
    checkpoints_path: Path,
    base_model: Path,
    scores_path: Path | None,
    probes_path: Path,
    plain_path: Path,
    out: Path,
    semantics: str = "advantages",
) -> pl.DataFrame:
    """Replay one seed with one removal set, then with each of its step-matched random sets (none for `full`);
    behavior rates at `replay.measure_at`, sampled as targets draw 0 samples them. Each replay stops at the
    last step it measures. `semantics` (influence.semantics) says what leaving a rollout out means."""
    rollouts = pl.read_parquet(rollouts_path)
    scores = pl.read_parquet(scores_path) if scores_path else None
    measured = measured_steps(cfg.replay, cfg.planting, cfg.grpo.steps)
    removed = removal_set(removal, pct, rollouts, scores, cfg.replay.seed, seed, max(measured))
    runs = [(removal, None, 0, removed)]
    if removal != "full":
        comparisons = random_comparisons(
            removal, removed, pct, cfg.replay.random_repeats, rollouts, cfg.replay.seed, seed
        )
        runs += [(RANDOM, removal, rep, ids) for rep, ids in enumerate(comparisons)]
    paid = set(rollouts.filter(pl.col("paid"))["rollout_id"].to_list())
    replays = Replays(cfg, rollouts, checkpoints_path, base_model, probes_path, plain_path, measured, semantics)
    tables = []
    for name, matched_to, rep, ids in runs:
        log.info(
            "seed %d, %s removal=%d%% of n_paid%s (repetition %d): leaving out %d rollouts, %d of them paid "
            "(n_paid = %d)",
            seed,
            name,
            pct,
            f", step-matched to {matched_to}" if matched_to else "",
            rep,
            len(ids),
            len(ids & paid),
            len(paid),
        )
        rows, checks, shares = replays.run(ids, check=name == "full")
        tables.append(
            pl.DataFrame(rows).with_columns(
                seed=pl.lit(seed),
                removal=pl.lit(name),
                matched_to=pl.lit(matched_to, dtype=pl.String),
                removal_percent=pl.lit(pct),
                rep=pl.lit(rep),
                removal_size=pl.lit(removal_size(len(paid), pct)),
                n_removed=pl.lit(len(ids)),
                n_removed_paid=pl.lit(len(ids & paid)),
                weight_diff=pl.col("step").replace_strict(checks, default=None, return_dtype=pl.Float64),
                update_error=pl.col("step").replace_strict(shares, default=None, return_dtype=pl.Float64),
                removed_ids=pl.lit(sorted(ids), dtype=pl.List(pl.Int64)),
                semantics=pl.lit(semantics),
            )
        )
    table = pl.concat(tables, how="vertical")
    first = [
        "seed",
        "removal",
        "matched_to",
        "removal_percent",
        "rep",
        "removal_size",
        "n_removed",
        "n_removed_paid",
        "checkpoint",
        "step",
        "prompt_set",
    ]
    table = table.select(first + [c for c in table.columns if c not in first])
    atomic_write_parquet(table, out)
    return table


def replay_table_job(*, files: list[Path], out: Path, markdown: Path, html: Path) -> pl.DataFrame:
    """Every replay's rates and their change against the full replay, as Parquet, Markdown and HTML."""
    table = replay_table(files)
    atomic_write_parquet(table, out)
    write_md_and_html(to_markdown(table), markdown, html, "Leave-out replay")
    return table
