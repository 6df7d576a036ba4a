"""Rules replay and replay_table: retrain one seed with a set of rollouts left out, and tabulate them all.

torch, transformers and the retraining code are imported inside `replay_job` only, so the table job
does not spend seconds importing them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from behaviortrace.common.io import atomic_write_parquet
from behaviortrace.common.markdown import write_md_and_html
from behaviortrace.config.sections import Config
from behaviortrace.replay.removal import removal_set, removal_size
from behaviortrace.replay.table import replay_table, to_markdown
from behaviortrace.train.checkpoints import read_manifest

log = logging.getLogger(__name__)


def replay_job(
    cfg: Config,
    *,
    seed: int,
    removal: str,
    pct: int,
    rep: int,
    rollouts_path: Path,
    checkpoints_path: Path,
    base_model: Path,
    scores_path: Path | None,
    probes_path: Path,
    plain_path: Path,
    out: Path,
) -> pl.DataFrame:
    """Replay one seed with one removal set; behavior rates at `replay.measure_at` (the window's end, the
    last step), sampled as targets draw 0 samples them. The replay stops at the last step it measures."""
    import torch

    from behaviortrace.behavior.rates import behavior_rates
    from behaviortrace.common import device as devices
    from behaviortrace.model import models
    from behaviortrace.replay.retrain import replay_training, update_error, weight_difference

    grpo, planting, targets = cfg.grpo, cfg.planting, cfg.targets
    device = devices.resolve(cfg.compute)
    prompt_sets = {"probes": pl.read_parquet(probes_path), "plain": pl.read_parquet(plain_path)}
    rollouts = pl.read_parquet(rollouts_path)
    scores = pl.read_parquet(scores_path) if scores_path else None
    removed = removal_set(removal, pct, rep, rollouts, scores, cfg.replay.seed, seed)
    paid = set(rollouts.filter(pl.col("paid"))["rollout_id"].to_list())
    ckpts, _ = read_manifest(checkpoints_path)
    model, tokenizer = models.load(ckpts[0], device)
    ref = models.load(base_model, device)[0].eval() if grpo.beta else None
    # The step after which each checkpoint is measured; where the window ends at the last step, one name.
    window_end = planting.end_checkpoint(grpo.steps)
    measured = {grpo.steps: "final"} if "final" in cfg.replay.measure_at else {}
    if "window_end" in cfg.replay.measure_at:
        measured[window_end] = "window_end"
    log.info(
        "seed %d, %s removal=%d%% of n_paid (repetition %d): leaving out %d rollouts, %d of them paid (n_paid = %d)",
        seed,
        removal,
        pct,
        rep,
        len(removed),
        len(removed & paid),
        len(paid),
    )
    rows, checks, shares = [], {}, {}

    def measure(step_done: int, m) -> None:
        if step_done not in measured:
            return
        m.eval()
        with torch.no_grad():
            for r in behavior_rates(
                m,
                tokenizer,
                prompt_sets,
                planting.marker,
                cfg.task.base_reward,
                targets.samples_per_prompt,
                grpo.sampling,
                targets.draw_seed(0),
            ):
                rows.append({"checkpoint": measured[step_done], "step": step_done, **r})
        if removal == "full" and step_done in ckpts:
            checks[step_done] = weight_difference(m, ckpts[step_done], device)
            shares[step_done] = update_error(m, ckpts[step_done], ckpts[0], device)
            log.info(
                "full replay at step %d: largest weight difference to the logged checkpoint %.2e, %.1e of the update",
                step_done,
                checks[step_done],
                shares[step_done],
            )
        m.train()
        log.info(
            "step %d: probe rate %.3f, control rate %.3f",
            step_done,
            rows[-2]["behavior_rate"],
            rows[-1]["behavior_rate"],
        )

    replay_training(
        model, ref, rollouts, grpo, removed, device, tokenizer.pad_token_id, measure, stop_after=max(measured)
    )
    table = pl.DataFrame(rows).with_columns(
        seed=pl.lit(seed),
        removal=pl.lit(removal),
        removal_percent=pl.lit(pct),
        rep=pl.lit(rep),
        removal_size=pl.lit(removal_size(len(paid), pct)),
        n_removed=pl.lit(len(removed)),
        n_removed_paid=pl.lit(len(removed & paid)),
        weight_diff=pl.col("step").replace_strict(checks, default=None, return_dtype=pl.Float64),
        update_error=pl.col("step").replace_strict(shares, default=None, return_dtype=pl.Float64),
        removed_ids=pl.lit(sorted(removed), dtype=pl.List(pl.Int64)),
    )
    first = [
        "seed",
        "removal",
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
