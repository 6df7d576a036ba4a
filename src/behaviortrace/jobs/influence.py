"""Rules influence, influence_set, influence_metrics and influence_figure.

- influence (one job per arm and seed): I_z for every rollout of the steps before T under both meanings of
  removal (through the advantages, and held: `influence.semantics` names the one the checklist reads), its parts,
  per-step sums, the job's own checks (the forward replay against the saved checkpoints, the logged gradient norms
  and forced target; optionally I_z of a rollout and of its group against float64 central differences of
  retraining), and its retraining: f(w_T) with each LDS subset removed (under both meanings, with
  `influence.lds_both_semantics`), each step (leave-one-step-out) and, for planted seeds, the paid set.
- influence_set (one job per planted seed): f(w_T) retrained with each leave-out replay set of influence.sets (an
  estimator's top-scored set) removed, for predicted-vs-measured.

torch and the training code are imported inside the jobs, so the table and figure jobs start fast.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import polars as pl

from behaviortrace.common.io import atomic_write_parquet, atomic_write_text, scratch_dir
from behaviortrace.config.sections import Config
from behaviortrace.influence.inputs import end_step, setup
from behaviortrace.influence.resources import STATES, check_disk, check_memory
from behaviortrace.influence.sets import (
    Zeroed,
    fd_steps,
    retrained_sets,
    zeroed_table,
)
from behaviortrace.influence.table import CHECK_COLUMNS, SEED_FILES
from behaviortrace.report.tables import PLANTED

log = logging.getLogger(__name__)


def influence_job(
    cfg: Config,
    *,
    arm: str,
    seed: int,
    rollouts_path: Path,
    steps_path: Path,
    checkpoints_path: Path,
    base_model: Path,
    probes_path: Path,
    out_rollouts: Path,
    out_steps: Path,
    out_checks: Path,
    out_retrain: Path,
    out_summary: Path,
    label_percents: tuple[int, ...] = (),
    replay_seed: int = 0,
) -> pl.DataFrame:
    """I_z of one arm and seed, per-step sums, the job's checks and its retraining (the LDS subsets and, given
    `label_percents`, the leave-out replay's paid sets, chosen with `replay_seed`), each to its file."""
    from behaviortrace.influence.metagradient import StateStore, exact_influence
    from behaviortrace.influence.retrain import central_difference, retrain
    from behaviortrace.replay.retrain import update_error, weight_difference

    inf, end = cfg.influence, end_step(cfg)
    paths = (rollouts_path, checkpoints_path, base_model, probes_path)
    traj, objective, ckpts, rollouts, device = setup(cfg, *paths, inf.dtype)
    steps_log = pl.read_parquet(steps_path).sort("step")
    # Steps where the finite-difference check takes a rollout: only steps with a rollout that can move f.
    movable = [s for s in range(end) if len(traj.rows(s).rollout_ids)]
    checked = fd_steps(np.array(movable), inf.fd_rollouts, inf.seed, arm, seed) if movable else []
    log.info("%s%d: exact influence on f(w_%d), %d steps per segment, %s", arm, seed, end, inf.segment_steps, inf.dtype)
    checks = []

    def compare(step_done: int, t) -> None:
        if step_done in ckpts:
            error = weight_difference(t.model, ckpts[step_done], device)
            share = update_error(t.model, ckpts[step_done], ckpts[0], device)
            checks.append({"check": "checkpoint_weights", "step": step_done, "error": error})
            checks.append({"check": "checkpoint_update", "step": step_done, "error": share})
            log.info(
                "forward replay at step %d: largest weight difference to the checkpoint %.2e, %.1e of the update",
                step_done,
                error,
                share,
            )

    keep = set(checked) | (set(range(end)) if inf.leave_step_out else set())  # where retraining starts
    # The saved states (3P numbers each: 370 GB per seed at the paper's scale) go to a folder of a fixed name, so
    # that a rerun removes what a killed attempt left before it checks the disk.
    with scratch_dir(Path(out_rollouts).parent / STATES) as folder:
        check_disk(traj.model, end, keep, inf, folder)
        check_memory(traj.model, end, inf)
        store = StateStore(folder, "cpu")
        result = exact_influence(traj, objective, end, inf.segment_steps, store, keep, compare)
        logged = steps_log["grad_norm"].to_numpy()[:end]
        norm_error = float(np.max(np.abs(np.array(result.grad_norms) - logged) / np.maximum(logged, 1e-12)))
        checks.append({"check": "grad_norms", "step": end, "error": norm_error})
        logged_f = float(steps_log["target_logprob_after"][end - 1])
        checks.append({"check": "f_end", "step": end, "error": abs(result.f_end - logged_f)})
        log.info(
            "f(w_%d) = %.6f (training logged %.6f); grad norms within %.1e", end, result.f_end, logged_f, norm_error
        )

        started = time.time()
        if checked:
            traj64 = traj if inf.dtype == "float64" else setup(cfg, *paths, "float64")[0]
            groups = dict(rollouts.select("rollout_id", "group_id").iter_rows())
            for step in checked:
                rows = result.steps == step
                i = np.flatnonzero(rows)[np.argmax(np.abs(result.influence[rows]))]
                z = int(result.rollout_ids[i])
                group = rows & np.isin(result.rollout_ids, [r for r, g in groups.items() if g == groups[z]])
                # The rollout alone, and its whole group scaled together (the prompt's weight).
                for check, members in (
                    ("finite_difference", [z]),
                    ("finite_difference_group", result.rollout_ids[group]),
                ):
                    fd, _ = central_difference(traj64, store.load(step), members, inf.fd_delta, end, objective)
                    value = float(result.influence[np.isin(result.rollout_ids, members) & rows].sum())
                    error = abs(value - fd) / max(abs(fd), 1e-30)
                    checks.append(
                        {
                            "check": check,
                            "step": step,
                            "rollout_id": z,
                            "delta": inf.fd_delta,
                            "influence": value,
                            "measured": fd,
                            "error": error,
                        }
                    )
                    log.info(
                        "%s of rollout %d (step %d, %d rollouts): I = %.6g, central difference %.6g, relative error "
                        "%.2e",
                        check,
                        z,
                        step,
                        len(members),
                        value,
                        fd,
                        error,
                    )
        result.seconds["finite_difference"] = time.time() - started

        started = time.time()
        sets = retrained_sets(cfg, rollouts, end, arm, seed, label_percents, replay_seed)
        values = retrain(traj, store, sets, end, objective, inf.retrain_batch)
        result.seconds["retrain"] = time.time() - started

    table = result.table()
    steps = (
        table.group_by("step")
        .agg(pl.col("influence").sum(), pl.col("influence").abs().sum().alias("abs_influence"), pl.len().alias("n"))
        .sort("step")
    )
    check_table = pl.DataFrame(checks, schema=CHECK_COLUMNS)
    retrained = zeroed_table(sets, values)
    summary = {
        "arm": arm,
        "seed": seed,
        "end": end,
        "f_end": result.f_end,
        "dtype": inf.dtype,
        "semantics": inf.semantics,
        "segment_steps": inf.segment_steps,
        "parameters": sum(p.numel() for p in traj.params),
        "seconds": result.seconds,
    }
    atomic_write_parquet(table, out_rollouts)
    atomic_write_parquet(steps, out_steps)
    atomic_write_parquet(check_table, out_checks)
    atomic_write_parquet(retrained, out_retrain)
    atomic_write_text(json.dumps(summary, indent=1) + "\n", out_summary)
    log.info("%s%d: %d rollouts; seconds %s", arm, seed, table.height, result.seconds)
    return table


def influence_set_job(
    cfg: Config,
    *,
    seed: int,
    sets: list[tuple[str, int]],
    rollouts_path: Path,
    checkpoints_path: Path,
    base_model: Path,
    probes_path: Path,
    scores_paths: dict[str, Path],
    outs: list[Path],
) -> None:
    """f(w_T) retrained with each estimator's leave-out replay set removed (its top-scored set, as replay/removal.py
    chooses it), in the influence's dtype and semantics: one (removal, percent) of `sets` per file of `outs`, each
    from the same step-0 state. `scores_paths` holds each estimator's ranking scores. One job per seed: each
    retraining takes about a second, less than a job's start-up with torch and transformers."""
    from behaviortrace.influence.retrain import value_after
    from behaviortrace.replay.removal import measured_steps, removal_set

    end = end_step(cfg)
    traj, objective, _, rollouts, _ = setup(
        cfg, rollouts_path, checkpoints_path, base_model, probes_path, cfg.influence.dtype
    )
    start = traj.state()
    replay_end = max(measured_steps(cfg.replay, cfg.planting, cfg.grpo.steps))
    for (removal, pct), out in zip(sets, outs, strict=True):
        scores = pl.read_parquet(scores_paths[removal]) if removal in scores_paths else None
        removed = removal_set(removal, pct, rollouts, scores, cfg.replay.seed, seed, replay_end)
        started = time.time()
        value = value_after(traj, start, dict.fromkeys(removed, 0.0), end, objective)
        log.info(
            "seed %d, %s removal=%d%%: %d rollouts removed (%s), f(w_%d) = %.6f; %.1f s",
            seed,
            removal,
            pct,
            len(removed),
            cfg.influence.semantics,
            end,
            value,
            time.time() - started,
        )
        table = zeroed_table([Zeroed(removal, "rollout", pct, 0, removed, cfg.influence.semantics)], [value])
        atomic_write_parquet(table, out)


def influence_metrics_job(
    cfg: Config,
    *,
    seeds: list[tuple[str, int]],
    files: dict[str, list[Path]],
    score_keys: list[tuple[str, int, int, str, str]],
    scores: list[Path],
    step_scores: list[Path],
    set_seeds: list[int],
    set_files: list[Path],
    out: Path,
    csv: Path,
    top: Path,
    markdown: Path,
    html: Path,
    log_only: tuple[str, ...] = (),
) -> pl.DataFrame:
    """The influence table of every arm and seed (influence/table.py), its ten most influential rollouts,
    and both as Markdown. `log_only` names the log-only controls; `files` holds, per kind, one path per
    (arm, seed) of `seeds`; `set_files` the zeroed leave-out sets of the planted seeds `set_seeds`."""
    from behaviortrace.common.markdown import write_md_and_html
    from behaviortrace.influence.markdown import to_markdown
    from behaviortrace.influence.table import LdsSettings, SeedInputs, influence_table, top_rollouts

    by_seed = {}
    for (arm, seed, draw, estimator, target), roll, step in zip(score_keys, scores, step_scores, strict=True):
        by_seed.setdefault((arm, seed), {})[(draw, estimator, target)] = (roll, step)
    inputs = [
        SeedInputs(
            arm,
            seed,
            *(files[kind][i] for kind in SEED_FILES),
            scores=by_seed.get((arm, seed), {}),
            sets=[p for s, p in zip(set_seeds, set_files, strict=True) if arm == PLANTED and s == seed],
        )
        for i, (arm, seed) in enumerate(seeds)
    ]
    settings = LdsSettings(
        cfg.influence.bootstrap,
        cfg.influence.seed,
        tuple(log_only),
        cfg.checklist.min_lds,
        cfg.checklist.effect_target_kind,
    )
    table = influence_table(inputs, cfg.planting.window, settings)
    best = top_rollouts(inputs)
    atomic_write_parquet(table, out)
    atomic_write_text(table.write_csv(), csv)
    atomic_write_parquet(best, top)
    write_md_and_html(to_markdown(table, best, cfg.influence.semantics), markdown, html, "Exact influence")
    log.info("influence table: %d rows for %d arms and seeds", table.height, len(inputs))
    return table


def influence_figure_job(cfg: Config, *, table: Path, log_only: list[str], out: Path) -> None:
    """The influence figure from the influence table (under the configured meaning of removal), with the target the
    checklist judges I with."""
    from behaviortrace.influence.figure import influence_figure
    from behaviortrace.influence.table import of_semantics

    c = cfg.checklist
    influence_figure(of_semantics(pl.read_parquet(table), cfg.influence.semantics), c.effect_target_kind, out, log_only)
