"""The attribution checklist: first whether the run can judge methods at all (run items), then each attribution
method against each method item, pass / fail / inconclusive / n/a, with the numbers behind every verdict.

Rows have roles. Methods (estimators that use a behavior target) are what the checklist judges and counts.
Controls (target-free estimators, the log-only ones among them) are the bars a method must clear: their values are
shown beside each verdict and their own verdicts are reference, never counted. References are the exact influence
(the positive control of the causal items) and earlier-is-more (a negative one).

An item is judged only where some method could pass it: a cell whose control sits at the metric's ceiling is n/a
with its reason; an LDS cell where the exact influence does not reach the threshold judges no method (with none
left, the item is inconclusive). A method's pass on an item a log-only control also passes is counted apart.
Verdicts follow report/verdicts.py: pass needs every cell at 95%, FAIL needs evidence at the family-wise `alpha`
over every method test of the checklist, comparisons with a control are paired differences on shared bootstrap
resamples.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np
import polars as pl

from behaviortrace.common.markdown import markdown_table
from behaviortrace.config.sections import Checklist
from behaviortrace.evaluate.dense import STEP_OUT_POOLED
from behaviortrace.replay.table import window_end_probes
from behaviortrace.report import verdicts as V
from behaviortrace.report.tables import KEYS, PLACEBO, PLANTED, estimators_of, judged

PASS, FAIL, INCONCLUSIVE, NA = V.PASS, V.FAIL, V.INCONCLUSIVE, V.NA
METHOD, CONTROL, REFERENCE = "method", "control", "reference"
# Reference rows, judged on the LDS items only: the exact influence (the positive control: faithful where training
# is smooth), the cross-fitted datamodel where the influence table holds it (only at a design where an additive truth
# would reach the threshold), and earlier-is-more (a negative control: minus the step).
REFERENCES = ("influence", "datamodel", "earlier")
LDS_ITEMS = ("lds_rollout", "lds_group")
CAUSAL_ITEMS = ("replay_beats_random", *LDS_ITEMS)  # method items that remove rollouts (and replay_has_power)
# Metrics bounded above by 1 (a control at 1 cannot be beaten); lift's ceiling is the cell's own (`ceiling_lift`).
BOUNDED = ("auroc", "average_precision", "precision_at_paid", "within_group_auc", "within_group_auc_fluency_resid")

RUN_ITEMS = {
    "sketch_covers_parameters": "The sketch covers every trainable parameter, and per-rollout sketches add up to "
    "the step gradient's sketch (self-check): on every step against TRL's own gradient with train-time capture, "
    "on one step per shard when sketching from checkpoints",
    "behavior_emerged": "The behavior emerged: probe minus control behavior rate at the end of the window, and "
    "controls low at every checkpoint",
    "headroom": "Evaluated where there is headroom: share of paid rollouts generated at checkpoints below saturation",
    "random_at_chance": "The random control is at chance on every seed and draw: its rollout lift, AUROC and step "
    "lift are consistent with a random ordering (two-sided hypergeometric, Mann-Whitney and step-permutation tests), "
    "Holm's procedure over every check at the family-wise error `alpha`",
    "paid_unfindable_reported": "Paid rollouts unfindable by construction (advantage 0) are counted, and their share "
    "is small",
    "replay_has_power": "The causal check has power: leaving out the paid set (as `influence.semantics` says) and "
    "retraining lowers the probe behavior "
    "rate at the window's end by at least the threshold, and more than every removal of as many rollouts at random "
    "from the same steps, on every seed and k",
}
ITEMS = {
    "beats_norm_step": "Beats the norm control at step level on every seed and draw: the paired difference with the "
    "norm (at its strongest step variant) above 0",
    "beats_norm_rollout": "Beats the norm control at rollout level on every seed and draw (paired difference)",
    "beats_fluency": "Beats the fluency control at rollout level on every seed and draw, in every listed stratum, "
    "fluency taken both ways (max(AUC, 1 - AUC): a reversed predictor predicts as well)",
    "beats_log_only_rollout": "Orders rollouts as removing them would, better than the rollout log can: over every "
    "rollout before T, its rank agreement with the exact influence I (targeted estimators at `effect_target_kind`), "
    "pooled over planted seeds and draws, has its margin over the strongest log-only control and over the random "
    "control above 0 (a bootstrap over seeds, then groups); judged only where I's own rollout LDS, pooled over "
    "seeds, clears the threshold at the smallest subset size; never on the label's metrics, which the log wins by "
    "construction",
    "beats_log_only_group": "The same over every prompt group before T (a group's scores and I summed over its "
    "rollouts), gated on I's group LDS",
    "survives_fluency_residualization": "Within-group AUC after residualizing on fluency has its interval above "
    "0.5 on every seed and draw",
    "stable_across_draws": "Stable across generation draws: rank correlation of rollout scores between draws (its "
    "interval from a bootstrap over training steps), and the spread of the residualized within-group AUC across "
    "draws, as far as the draws' intervals allow",
    "stable_across_seeds": "Stable across seeds: sd of the residualized within-group AUC across seeds, as far as "
    "the seeds' intervals allow, and every seed agreeing on whether its interval is above 0.5",
    "placebo_no_enrichment": "No enrichment in the placebo run (no bonus paid), judged where the label is a coin "
    "flip: among the placebo's rollouts that show the behavior with the trigger, in the `placebo_stratum`, the "
    "eligible ones (a hash that training never saw) are ranked at chance: the behavior-matched AUC's interval "
    "within 0.5 ± `max_placebo_auc_gap` on every cell to pass; enrichment rejected by one-sided tests (AUC and step "
    "lift) to fail",
    "replay_beats_random": "Removing its top-scored rollouts and retraining lowers the probe behavior rate at the "
    "window's end more than every removal of k rollouts at random from the same steps, on every seed and k",
    "tracks_effect": "Step scores track the measured behavior change: correlation of each step's score with the "
    "measured change of the forced target's log-prob across that step's update, on every seed and draw",
    "tracks_step_removal": "Step scores predict what removing a whole step does: over every step before T, "
    "minus each step's summed score against the measured change of f(w_T) when that step's rollouts are removed and "
    "training replayed (leave-one-step-out), the Spearman correlation pooled over planted seeds and draws has its "
    "margin over the strongest log-only control and over random above 0 (a bootstrap over seeds, then steps)",
    "lds_rollout": "Predicts what removing rollouts does: the LDS over random subsets of rollouts before T, retrained "
    "with them removed as `influence.semantics` says (targeted estimators at `effect_target_kind`), has its "
    "interval at or above the threshold and its margin over the strongest log-only control above 0, on every planted "
    "seed, draw and subset size; judged only in the cells where the exact influence itself passes",
    "lds_group": "The same over random subsets of whole groups (removed through the advantages, a group is its "
    "prompt never sampled)",
}
# Where each method item is shown passable when no row of a run passes it: a test in which a faithful estimator
# passes it and a negative control fails it.
POSITIVE_CONTROL_TESTS = {item: f"tests/test_checklist_items.py::test_{item}" for item in ITEMS}


@dataclass
class Verdict:
    verdict: str
    detail: str
    numbers: dict = field(default_factory=dict)


def _ci(row: dict) -> str:
    return f"{row['value']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"


def _cells(rows: pl.DataFrame):
    """(seed, draw, {(level, metric): row}) for each seed and draw of `rows`."""
    for (seed, draw), grp in rows.group_by(["seed", "draw"], maintain_order=True):
        yield seed, draw, {(r["level"], r["metric"]): r for r in grp.iter_rows(named=True)}


def _resid_auc(metrics: pl.DataFrame, est: str, target: str, stratum: str) -> pl.DataFrame:
    return judged(metrics, target, stratum).filter(
        (pl.col("estimator") == est)
        & (pl.col("level") == "rollout")
        & (pl.col("metric") == "within_group_auc_fluency_resid")
    )


# Run items --------------------------------------------------------------------------------------------------


def sketch_covers(shards: list[dict], max_error: float) -> Verdict:
    """From the attributes each sketch job wrote after checking its own store."""
    if not shards:
        return Verdict(NA, "no sketch shards")
    missing = [s for s in shards if s.get("n_trainable") is None or s.get("self_check_error") is None]
    if missing:
        return Verdict(FAIL, f"{len(missing)} shards did not record their coverage and self-check")
    uncovered = [s for s in shards if s["n_params"] != s["n_trainable"]]
    worst = max(s["self_check_error"] for s in shards)
    steps, checked = sum(s.get("steps", 0) for s in shards), sum(s.get("checked_steps", 0) for s in shards)
    # Train-time capture checks every step against the gradient TRL applied; it must not skip one.
    unchecked = [s for s in shards if s.get("mode") == "train" and s.get("checked_steps") != s.get("steps")]
    ok = not uncovered and not unchecked and worst <= max_error
    against = "TRL's gradient" if all(s.get("mode") == "train" for s in shards) else "the step gradient"
    return Verdict(
        PASS if ok else FAIL,
        f"{len(shards) - len(uncovered)}/{len(shards)} shards sketch all {shards[0]['n_trainable']:,} "
        f"trainable parameters; {checked}/{steps} steps checked against {against}, largest self-check error "
        f"{worst:.1e} (limit {max_error:.0e})",
        {
            "shards": len(shards),
            "uncovered_shards": len(uncovered),
            "max_self_check_error": worst,
            "checked_steps": checked,
            "steps": steps,
            "unchecked_train_shards": len(unchecked),
        },
    )


def behavior_emerged(training: pl.DataFrame, min_gap: float, max_control: float) -> Verdict:
    rows = training.filter(pl.col("arm") == PLANTED).sort("seed")
    gaps = {int(r["seed"]): r["probe_rate_window_end"] - r["plain_rate_window_end"] for r in rows.iter_rows(named=True)}
    peaks = {int(r["seed"]): r["plain_rate_max"] for r in rows.iter_rows(named=True)}
    text = ", ".join(f"seed {s}: {g:.2f}" for s, g in gaps.items())
    peak_text = ", ".join(f"seed {s}: {p:.2f}" for s, p in peaks.items())
    ok = all(g >= min_gap for g in gaps.values()) and all(p <= max_control for p in peaks.values())
    return Verdict(
        PASS if ok else FAIL,
        f"probe − control rate at window end: {text} (at least {min_gap}); highest control rate at any "
        f"checkpoint: {peak_text} (at most {max_control})",
        {"gap_by_seed": gaps, "control_max_by_seed": peaks},
    )


def headroom(metrics: pl.DataFrame, min_share: float) -> Verdict:
    """Share of paid rollouts below saturation, from the counts of paid rollouts per stratum that evaluate records."""
    paid = metrics.filter((pl.col("arm") == PLANTED) & (pl.col("metric") == "paid_unfindable"))
    shares = {}
    for (seed, draw), grp in paid.group_by(["seed", "draw"], maintain_order=True):
        n = dict(zip(grp["stratum"].to_list(), grp["n"].to_list(), strict=False))
        shares[(int(seed), int(draw))] = n.get("below_saturation", 0) / n["all"] if n.get("all") else float("nan")
    worst = min(shares.values())
    return Verdict(
        PASS if worst >= min_share else FAIL,
        f"paid share below saturation: lowest {worst:.2f} over {len(shares)} seed × draw cells (at least {min_share})",
        {"share": {f"seed{s}_draw{d}": v for (s, d), v in shares.items()}},
    )


def _against_null(checks: list[tuple[str, float]], alpha: float) -> tuple[list[str], str]:
    """Holm over (description, p-value) checks: the rejected ones, and a line on the smallest p-value."""
    rejected = V.null_rejected([p for _, p in checks], alpha)
    off = [f"{what} (p = {p:.2g})" for (what, p), r in zip(checks, rejected, strict=True) if r]
    what, p = min(checks, key=lambda c: c[1] if c[1] == c[1] else 2.0)
    held = f"{len(checks) - len(off)}/{len(checks)} checks hold at family-wise α = {alpha:.2g} (Holm)"
    return off, f"{held}; smallest p {p:.2g}: {what}"


def random_at_chance(metrics: pl.DataFrame, alpha: float) -> Verdict:
    rows = metrics.filter((pl.col("arm") == PLANTED) & (pl.col("estimator") == "random") & (pl.col("stratum") == "all"))
    if not rows.height:
        return Verdict(NA, "the random control is not configured")
    checks = []
    for seed, draw, m in _cells(rows):
        shown = [("rollout", "lift"), ("rollout", "auroc"), ("step", "lift"), ("step", "lift_chance_band")]
        tests = [("rollout", "lift_p"), ("rollout", "auroc_p"), ("step", "lift_p")]
        if any(key not in m for key in shown + tests):
            continue
        lift, auc, step, band = (m[key] for key in shown)
        cell = f"seed {seed} draw {draw}"
        checks += [
            (f"{cell}: rollout lift {_ci(lift)}", m[("rollout", "lift_p")]["value"]),
            (f"{cell}: AUROC {_ci(auc)}", m[("rollout", "auroc_p")]["value"]),
            (f"{cell}: step lift {step['value']:.2f} vs null {_ci(band)}", m[("step", "lift_p")]["value"]),
        ]
    if not checks:
        return Verdict(NA, "no stratum-all metrics of the random control")
    off, line = _against_null(checks, alpha)
    detail = line + (f"; off: {'; '.join(off)}" if off else "")
    return Verdict(PASS if not off else FAIL, detail, {"checks": len(checks), "failed": off, "alpha": alpha})


def paid_unfindable(metrics: pl.DataFrame, max_share: float) -> Verdict:
    rows = metrics.filter(
        (pl.col("arm") == PLANTED)
        & (pl.col("metric") == "paid_unfindable")
        & (pl.col("stratum") == "all")
        & (pl.col("draw") == pl.col("draw").min())
    ).sort("seed")
    shares = {int(r["seed"]): (int(r["value"]), int(r["n"])) for r in rows.iter_rows(named=True)}
    worst = max(v / n if n else 0.0 for v, n in shares.values())
    text = ", ".join(f"seed {s}: {v} of {n}" for s, (v, n) in shares.items())
    return Verdict(
        PASS if worst <= max_share else FAIL,
        f"{text} (share at most {max_share})",
        {"unfindable_of_paid": {s: list(v) for s, v in shares.items()}},
    )


def _against_random(s: pl.DataFrame, removal: str) -> pl.DataFrame:
    """Per seed and k, from the replay summary at the window's end on probes: the change in probe rate when
    `removal`'s set is left out, beside the lowest, mean and highest change of the random sets step-matched to it."""
    rand = s.filter((pl.col("removal") == "random") & (pl.col("matched_to") == removal)).select(
        "seed",
        "removal_percent",
        random_low=pl.col("change_low"),
        random_mean=pl.col("change"),
        random_high=pl.col("change_high"),
        random_reps="reps",
    )
    return (
        s.filter((pl.col("removal") == removal) & pl.col("matched_to").is_null())
        .join(rand, on=["seed", "removal_percent"], how="inner")
        .sort("seed", "removal_percent")
    )


def _replay_text(both: pl.DataFrame, name: str) -> str:
    """Each cell's numbers, and how often every cell would pass by chance if the set were no better than its
    random matches (it is then below all R of them with probability 1 / (R + 1) per cell)."""
    cells = "; ".join(
        f"seed {r['seed']} removal {r['removal_percent']}%: {name}{r['change']:+.3f} vs random "
        f"{r['random_low']:+.3f} to {r['random_high']:+.3f} (mean {r['random_mean']:+.3f})"
        for r in both.iter_rows(named=True)
    )
    chance = float(np.prod(1.0 / (both["random_reps"].to_numpy() + 1.0)))
    return f"{cells} (a set no better than random passes every cell with probability {chance:.1e})"


def replay_has_power(s: pl.DataFrame, min_drop: float) -> Verdict:
    """The label set's change against the threshold and against every random removal. Without it the
    estimators' replay item means nothing: a replay that any removal derails ranks every set as causal."""
    both = _against_random(s, "label")
    if not both.height:
        return Verdict(NA, "no label and random replays to compare")
    ok = ((both["change"] < both["random_low"]) & (both["change"] <= -min_drop)).to_list()
    short = ((both["change"] >= both["random_mean"]) | (both["change"] > -min_drop)).to_list()
    return Verdict(
        V.three(ok, short),
        f"{_replay_text(both, 'label ')}; label set at most {-min_drop:+.2f} and below every random removal to pass, "
        "above the threshold or at or above the random mean in a cell to fail, otherwise inconclusive",
        {"cells": len(ok), "with_power": int(sum(ok))},
    )


# Method items -------------------------------------------------------------------------------------------------


def _ceiling(metrics: pl.DataFrame, row: dict) -> float:
    """The largest value `row`'s metric can take in its cell."""
    if row["metric"] in BOUNDED:
        return 1.0
    if row["metric"] == "lift":
        same = metrics.filter(
            (pl.col("arm") == row["arm"])
            & (pl.col("seed") == row["seed"])
            & (pl.col("draw") == row["draw"])
            & (pl.col("estimator") == row["estimator"])
            & (pl.col("level") == row["level"])
            & (pl.col("stratum") == row["stratum"])
            & (pl.col("metric") == "ceiling_lift")
        )
        return float(same["value"][0]) if same.height else float("inf")
    return float("inf")


def replicate_index(replicates: pl.DataFrame | None) -> dict[tuple, np.ndarray]:
    """The bootstrap replicates of each metric row, by its key (report/tables.py KEYS)."""
    if replicates is None:
        return {}
    return {tuple(r[k] for k in KEYS): np.asarray(r["replicates"], float) for r in replicates.iter_rows(named=True)}


def _replicates(index: dict[tuple, np.ndarray], row: dict) -> np.ndarray | None:
    return index.get(tuple(row[k] for k in KEYS))


def _fold(row: dict, reps: np.ndarray) -> tuple[dict, np.ndarray]:
    """An AUC taken both ways: value max(v, 1 - v), each resample turned the way the value is."""
    if row["value"] >= 0.5:
        return row, reps
    return {**row, "value": 1 - row["value"]}, 1 - reps


def beats(
    metrics: pl.DataFrame,
    est: str,
    controls: list[str],
    comparisons: list[tuple[str, str, str]],
    target: str,
    replicates: dict[tuple, np.ndarray],
    family: V.Family = V.PER_CELL,
    two_sided: bool = False,
) -> Verdict:
    """In every cell of every (level, metric, stratum) comparison, the paired difference between the estimator and
    each control (at step level each control at both its step variants) above 0: pass where every difference's
    interval lies above 0, fail where a widened interval of one lies below; a cell where a control sits at the
    metric's ceiling cannot be passed and is not judged."""
    if est in controls:
        return Verdict(NA, "is the control" if len(controls) == 1 else "is one of the controls")
    passes, fails, lines, shut, strongest, tests = [], [], [], [], [], 0
    for level, metric, stratum in comparisons:
        rows = judged(metrics, target, stratum).filter(pl.col("metric") == metric)
        levels = ["step", "step_summed"] if level == "step" else [level]
        own = rows.filter((pl.col("estimator") == est) & (pl.col("level") == level))
        ctl = rows.filter(pl.col("estimator").is_in(controls) & pl.col("level").is_in(levels))
        judged_cells, closest = 0, None
        for r in own.sort("seed", "draw").iter_rows(named=True):
            mine = _replicates(replicates, r)
            others = ctl.filter((pl.col("seed") == r["seed"]) & (pl.col("draw") == r["draw"]))
            if mine is None or not others.height:
                continue
            cell, blocked = [], None
            for c in others.iter_rows(named=True):
                reps = _replicates(replicates, c)
                if reps is None:
                    continue
                if two_sided:
                    c, reps = _fold(c, reps)
                if c["value"] >= _ceiling(metrics, c) - 1e-12:
                    blocked = c
                    break
                diff, low, high = V.paired(mine, reps, r["value"], c["value"])
                cell.append((diff, low, high, c))
            where = f"{level} {metric}, {stratum}, seed {r['seed']} draw {r['draw']}"
            if blocked is not None:
                shut.append(f"{where}: {blocked['estimator']} at the ceiling ({blocked['value']:.3f})")
                continue
            if not cell:
                continue
            judged_cells += 1
            tests += len(cell)  # one paired difference per control (and step variant)
            diff, low, high, c = min(cell, key=lambda x: x[0])
            strongest.append(c["value"])
            passes.append(all(lo > 0 for _, lo, _, _ in cell))
            fails.append(any(V.widened_high(d, hi, family.z) < 0 for d, _, hi, _ in cell))
            if closest is None or low < closest[1]:
                closest = (diff, low, high, c, r)
        if closest is not None:
            diff, low, high, c, r = closest
            lines.append(
                f"{level} {metric}, {stratum}: {judged_cells} cells; closest: seed {r['seed']} draw {r['draw']} "
                f"{r['value']:.3f} − {c['estimator']} {c['value']:.3f} = {diff:+.3f} [{low:+.3f}, {high:+.3f}]"
            )
    detail = "; ".join(lines)
    if shut:
        detail += ("; " if detail else "") + f"not judged where no method can pass: {'; '.join(shut)}"
    if not passes:
        if shut:
            return Verdict(NA, f"no method can beat the controls here: {'; '.join(shut)}", {"cells": 0})
        levels = ", ".join(sorted({level for level, _, _ in comparisons}))
        return Verdict(NA, f"no {levels}-level metrics for {est} or the controls", {"cells": 0})
    return Verdict(
        V.three(passes, fails),
        detail,
        {
            "cells": len(passes),
            "tests": tests,
            "beaten": int(sum(passes)),
            "fails": int(sum(fails)),
            "control_max": max(strongest),
        },
    )


def _best_control(metrics: pl.DataFrame, controls: list[str], where) -> str:
    """The strongest control's mean value over the cells `where` selects, for the detail of an item."""
    rows = metrics.filter(pl.col("estimator").is_in(controls) & where)
    if not rows.height:
        return ""
    # Ties (several controls at 1.000) go to the first name: group_by's order differs from run to run.
    means = rows.group_by("estimator").agg(pl.col("value").mean())
    best = means.sort(["value", "estimator"], descending=[True, False]).row(0, named=True)
    return f"; strongest control: {best['estimator']} at {best['value']:.3f} (mean over cells)"


def survives_residualization(
    metrics: pl.DataFrame, est: str, target: str, stratum: str, family: V.Family = V.PER_CELL, controls=()
) -> Verdict:
    rows = _resid_auc(metrics, est, target, stratum)
    if not rows.height:
        return Verdict(NA, "no residualized within-group AUC")
    cells = [V.above(r["value"], r["ci_low"], r["ci_high"], 0.5, family.z) for r in rows.iter_rows(named=True)]
    worst = rows.sort("ci_low", "seed", "draw").row(0, named=True)  # ties: the first seed and draw
    where = (
        (pl.col("arm") == PLANTED)
        & (pl.col("stratum") == stratum)
        & (pl.col("level") == "rollout")
        & (pl.col("metric") == "within_group_auc_fluency_resid")
    )
    return Verdict(
        V.three([p for p, _ in cells], [f for _, f in cells]),
        f"{int((rows['ci_low'] > 0.5).sum())}/{rows.height} cells above 0.5; lowest: seed {worst['seed']} "
        f"draw {worst['draw']} {_ci(worst)}{_best_control(metrics, list(controls), where)}",
        {"cells": rows.height, "lowest_ci_low": worst["ci_low"]},
    )


def sd_range(lows: np.ndarray, highs: np.ndarray, grid: int = 2001) -> tuple[float, float]:
    """The smallest and the largest sample sd of values that each lie within their interval. The largest sits at
    a corner of the box (every value at an end); the smallest at every value as near a common point c as its
    interval allows, c searched on a grid over the intervals' span."""
    lows, highs = np.asarray(lows, float), np.asarray(highs, float)
    corners = np.array(list(itertools.product(*zip(lows, highs, strict=True))))
    c = np.linspace(lows.min(), highs.max(), grid)
    nearest = np.clip(c[:, None], lows[None, :], highs[None, :])
    return float(nearest.std(axis=1, ddof=1).min()), float(corners.std(axis=1, ddof=1).max())


def _widened(rows: pl.DataFrame, z: float) -> tuple[np.ndarray, np.ndarray]:
    v, lo, hi = (rows[c].to_numpy().astype(float) for c in ("value", "ci_low", "ci_high"))
    return V.widened_low(v, lo, z), V.widened_high(v, hi, z)


def stable_across_draws(
    stability: pl.DataFrame,
    metrics: pl.DataFrame,
    est: str,
    target: str,
    stratum: str,
    min_corr: float,
    max_spread: float,
    family: V.Family = V.PER_CELL,
) -> Verdict:
    """Pass where the rank correlation's interval clears `min_corr` on every seed and the largest spread the
    draws' intervals allow stays within `max_spread`; fail where a widened correlation interval lies wholly below,
    or the smallest spread the widened intervals allow is above; inconclusive in between."""
    rows = stability.filter((pl.col("estimator") == est) & pl.col("target").is_in([target, "none"]))
    if not rows.height or rows["draws"].min() < 2:
        return Verdict(NA, "fewer than two generation draws")
    passes, fails = [], []
    for r in rows.iter_rows(named=True):
        corr, low, high = (r[f"rank_correlation_min{s}"] for s in ("", "_ci_low", "_ci_high"))
        passes.append(low >= min_corr)
        fails.append(V.widened_high(corr, high, family.z) < min_corr)
    auc = _resid_auc(metrics, est, target, stratum)
    spreads = []
    for seed in sorted(auc["seed"].unique().to_list()):
        own = auc.filter(pl.col("seed") == seed)
        if own.height < 2:
            continue
        high95 = V.range_bounds(own["ci_low"].to_numpy(), own["ci_high"].to_numpy())[1]
        low_fw = V.range_bounds(*_widened(own, family.z))[0]
        spread = float(own["value"].max() - own["value"].min())
        spreads.append((seed, spread, low_fw, high95))
        passes.append(high95 <= max_spread)
        fails.append(low_fw > max_spread)
    worst = rows.sort("rank_correlation_min", "seed").row(0, named=True)
    text = (
        f"lowest rank correlation between draws {worst['rank_correlation_min']:.3f} "
        f"[{worst['rank_correlation_min_ci_low']:.3f}, {worst['rank_correlation_min_ci_high']:.3f}] (at least "
        f"{min_corr})"
    )
    if spreads:
        seed, spread, low, high = max(spreads, key=lambda x: x[1])
        text += (
            f"; largest spread of the residualized AUC over draws {spread:.3f} (seed {seed}; up to {high:.3f} "
            f"within the draws' intervals, at least {low:.3f} at the family-wise level; at most {max_spread})"
        )
    return Verdict(
        V.three(passes, fails), text, {"cells": len(passes), "rank_correlation_min": worst["rank_correlation_min"]}
    )


def stable_across_seeds(
    metrics: pl.DataFrame, est: str, target: str, stratum: str, max_sd: float, family: V.Family = V.PER_CELL
) -> Verdict:
    """Pass where the largest sd the seeds' intervals allow is within `max_sd` and the seeds agree on whether the
    AUC is above 0.5 (every one above, or none); fail where the smallest sd the widened intervals allow is above
    `max_sd`, or one seed is wholly above 0.5 and another wholly below at the family-wise level; inconclusive in
    between."""
    by_seed = (
        _resid_auc(metrics, est, target, stratum)
        .group_by("seed")
        .agg(pl.col("value").mean(), pl.col("ci_low").mean(), pl.col("ci_high").mean())
        .sort("seed")
    )
    if by_seed.height < 2:
        return Verdict(NA, "fewer than two seeds")
    sd = float(by_seed["value"].std())
    lows, highs = by_seed["ci_low"].to_numpy(), by_seed["ci_high"].to_numpy()
    wide_lows, wide_highs = _widened(by_seed, family.z)
    sd_high = sd_range(lows, highs)[1]
    sd_low = sd_range(wide_lows, wide_highs)[0]
    above, below = int((lows > 0.5).sum()), int((highs < 0.5).sum())
    agree = above in (0, by_seed.height)
    passes = sd_high <= max_sd and agree
    fails = sd_low > max_sd or (bool((wide_lows > 0.5).any()) and bool((wide_highs < 0.5).any()))
    values = ", ".join(f"{v:.3f}" for v in by_seed["value"].to_list())
    return Verdict(
        V.three([passes], [fails]),
        f"residualized AUC by seed {values}: sd {sd:.3f}, up to {sd_high:.3f} within the seeds' intervals and at "
        f"least {sd_low:.3f} at the family-wise level (at most {max_sd}); interval above 0.5 on {above}/"
        f"{by_seed.height} seeds and below on {below} (all or none above to agree)",
        {"cells": 1, "sd": sd, "agree": agree},
    )


def placebo_no_enrichment(
    metrics: pl.DataFrame,
    est: str,
    target: str,
    stratum: str,
    max_gap: float,
    family: V.Family = V.PER_CELL,
    alpha: float | None = None,
) -> Verdict:
    """In a placebo, eligibility is a hash of (seed, rollout id, step) that training never saw, so among the
    rollouts that show the behavior with the trigger it is a coin flip: a faithful estimator ranks the eligible
    ones at chance however strongly it responds to the behavior itself. Pass needs evidence of chance (every
    behavior-matched AUC interval within 0.5 ± `max_gap`), FAIL evidence of enrichment (Holm over the row's
    one-sided tests at its share of the family-wise error; `alpha` replaces that share where given)."""
    if not metrics.filter(pl.col("arm") == PLACEBO).height:
        return Verdict(NA, "no placebo run configured (placebo.enabled: false)")
    rows = judged(metrics, target, stratum, arm=PLACEBO).filter(pl.col("estimator") == est)
    checks, within = [], []
    for seed, draw, m in _cells(rows):
        auc, auc_p = m.get(("rollout", "behavior_matched_auc")), m.get(("rollout", "behavior_matched_auc_p"))
        step, band = m.get(("step", "behavior_matched_lift")), m.get(("step", "behavior_matched_lift_chance_band"))
        step_p = m.get(("step", "behavior_matched_lift_p"))
        cell = f"seed {seed} draw {draw}"
        if auc and auc_p:
            checks.append((f"{cell}: AUC {_ci(auc)}", auc_p["value"]))
            within.append(0.5 - max_gap <= auc["ci_low"] and auc["ci_high"] <= 0.5 + max_gap)
        if step and band and step_p:
            checks.append((f"{cell}: step lift {step['value']:.2f} vs null {_ci(band)}", step_p["value"]))
    if not checks:
        return Verdict(NA, f"no placebo rollouts showing the behavior with the trigger, eligible and not, in {stratum}")
    budget = alpha if alpha is not None else family.budget(len(checks))
    off, line = _against_null(checks, budget)
    shown = "; ".join(what for what, _ in checks)
    chance = f"AUC within 0.5 ± {max_gap} on {sum(within)}/{len(within)} cells"
    detail = f"{chance}; {line}; {shown}" if not off else f"enriched: {'; '.join(off)}; {chance}; {line}"
    verdict = FAIL if off else PASS if within and all(within) else INCONCLUSIVE
    return Verdict(verdict, detail, {"cells": len(checks), "checks": len(checks), "enriched": off})


def replay_beats_random(s: pl.DataFrame, est: str, family: V.Family = V.PER_CELL) -> Verdict:
    """The estimator's change against every step-matched random removal (verdicts.beats_random)."""
    if est == "random":  # its top-scored set are k rollouts at random: the baseline itself
        return Verdict(NA, "is the random baseline")
    if not s.filter(pl.col("removal") == est).height:
        return Verdict(NA, "not replayed (replay.estimators)")
    both = _against_random(s, est)
    if not both.height:
        return Verdict(NA, "no random replay to compare with")
    budget = family.budget(both.height)
    cells = [
        (r["change"], r["random_low"], r["random_high"], int(r["random_reps"])) for r in both.iter_rows(named=True)
    ]
    below, fails, chance = V.beats_random(cells, budget)
    return Verdict(
        V.three(below, [fails]),
        f"{_replay_text(both, '')}; below every random removal in every cell to pass; above every one in every cell, "
        f"where that has probability {chance:.1e} for a set no better than random and that is within the family-wise "
        f"error ({budget:.1g}), to fail; otherwise inconclusive",
        {"cells": len(cells), "tests": len(cells), "beaten": sum(below)},
    )


def tracks_effect(
    metrics: pl.DataFrame, est: str, cfg: Checklist, family: V.Family = V.PER_CELL, controls=()
) -> Verdict:
    """The estimator's effect correlation on every seed and draw, beside the strongest control's and the label's."""
    effect = judged(metrics, cfg.effect_target_kind, cfg.stratum).filter(pl.col("level") == "effect")
    rows = effect.filter(pl.col("metric") == cfg.effect_metric)
    own = rows.filter(pl.col("estimator") == est).sort("seed", "draw")
    given = effect.filter((pl.col("metric") == "effect_spearman_given_step") & (pl.col("estimator") == est))
    if not own.height:
        return Verdict(NA, "no measured effect to compare with (step log without target_change)")
    labels = rows.filter(pl.col("estimator") == "label").sort("seed", "draw")
    limit = cfg.min_effect_correlation
    cells = [V.at_least(r["value"], r["ci_low"], r["ci_high"], limit, family.z) for r in own.iter_rows(named=True)]
    text = "; ".join(f"seed {r['seed']} draw {r['draw']}: {_ci(r)}" for r in own.iter_rows(named=True))
    paid = ", ".join(f"{v:.2f}" for v in labels.unique(["seed", "draw"], maintain_order=True)["value"].to_list())
    best = _best_control(effect, list(controls), pl.col("metric") == cfg.effect_metric)
    return Verdict(
        V.three([p for p, _ in cells], [f for _, f in cells]),
        f"{cfg.effect_metric} {text} (interval at least {limit}); given the step number: "
        f"{', '.join(f'{v:.2f}' for v in given.sort('seed', 'draw')['value'].to_list())}; paid count per step: "
        f"{paid}{best}",
        {"cells": len(cells), "tracking": sum(p for p, _ in cells), "values": own["value"].to_list()},
    )


DENSE = {"rollout": "rollout_dense", "group": "group_dense"}  # the dense endpoint's level per LDS level


def _pooled_margins(values: dict, text: list[str]) -> list[tuple[float, float, float]]:
    """A pooled endpoint's margins over the strongest log-only control and over random (value, low, high), each
    added to `text`."""
    margins = []
    for margin, name in (("over_log_only", "strongest log-only"), ("over_random", "random")):
        if margin in values:
            v, lo, hi = (values[f"{margin}{end}"] for end in ("", "_low", "_high"))
            margins.append((v, lo, hi))
            text.append(f"over {name} {v:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    return margins


def tracks_step_removal(
    influence: pl.DataFrame | None, est: str, log_only: list[str], cfg: Checklist, family: V.Family = V.PER_CELL
) -> Verdict:
    """The pooled leave-one-step-out endpoint (STEP_OUT_POOLED rows of the influence table): its margins over the
    strongest log-only control and over random, each a test (pass: both intervals above 0; FAIL: a widened one
    below 0). A measured truth: no gate."""
    if est in log_only:
        return Verdict(NA, "is one of the controls")
    rows = (
        influence.filter(
            (pl.col("estimator") == est)
            & pl.col("target").is_in([cfg.effect_target_kind, "none"])
            & (pl.col("level") == STEP_OUT_POOLED)
        )
        if influence is not None
        else None
    )
    if rows is None or not rows.height:
        return Verdict(NA, "no leave-one-step-out (influence.leave_step_out)")
    values = {r["metric"]: r["value"] for r in rows.iter_rows(named=True)}
    text = [f"Spearman with leave-one-step-out {values['spearman']:.3f} [{values['spearman_low']:.3f}, "
            f"{values['spearman_high']:.3f}] over {int(rows['n'][0])} steps"]  # fmt: skip
    margins = _pooled_margins(values, text)
    passes, fails = V.margins_above(margins, family.z)
    return Verdict(V.three([passes], [fails]), ", ".join(text), {"cells": 1, "tests": len(margins)})


def faithful_reference(influence: pl.DataFrame, level: str, limit: float) -> tuple[bool, str]:
    """Whether I's own LDS at `level`, pooled over planted seeds (influence/table.py pooled_lds_rows: a bootstrap
    over seeds, then each seed's subsets), clears `limit` at the smallest subset size, where a first-order truth is
    meant to hold; and the numbers. Pooled, not per seed: thirty subsets per seed leave each seed's interval so wide
    that which levels are judged would be a coin flip."""
    exact = influence.filter(
        (pl.col("estimator") == "influence") & (pl.col("level") == f"{level}_subset_pooled")
        & pl.col("metric").is_in(["lds", "lds_low", "lds_high"])
    )  # fmt: skip
    if not exact.height:
        return False, f"no pooled {level}-level LDS of I"
    pct = exact["removal_percent"].min()
    value = {r["metric"]: r["value"] for r in exact.filter(pl.col("removal_percent") == pct).iter_rows(named=True)}
    ok = value["lds_low"] >= limit
    return (
        ok,
        f"I's LDS at {level}s {pct}%, pooled over seeds: {value['lds']:.2f} [{value['lds_low']:.2f}, "
        f"{value['lds_high']:.2f}]",
    )


def beats_log_only(
    influence: pl.DataFrame | None,
    est: str,
    log_only: list[str],
    cfg: Checklist,
    family: V.Family = V.PER_CELL,
    level: str = "rollout",
) -> Verdict:
    """The dense endpoint (evaluate/dense.py) at `level`: the margins over the strongest log-only control and over
    the random control, each a test (pass: both intervals above 0; FAIL: a widened one below 0). Where I is not
    shown faithful to removal at the level the cell is not judged: inconclusive, with why."""
    if est in log_only:
        return Verdict(NA, "is one of the controls")
    if influence is None:
        return Verdict(NA, "no exact influence computed")
    rows = influence.filter(
        (pl.col("estimator") == est)
        & pl.col("target").is_in([cfg.effect_target_kind, "none"])
        & (pl.col("level") == DENSE[level])
    )
    values = {r["metric"]: r["value"] for r in rows.iter_rows(named=True)}
    if "spearman" not in values:
        return Verdict(NA, f"no dense endpoint for {est}")
    text = [f"agreement with I over every {level} {values['spearman']:.3f} [{values['spearman_low']:.3f}, "
            f"{values['spearman_high']:.3f}]"]  # fmt: skip
    margins = _pooled_margins(values, text)
    faithful, why = faithful_reference(influence, level, cfg.min_lds)
    numbers = {"cells": 1, "tests": len(margins)}
    if not faithful:
        return Verdict(INCONCLUSIVE, ", ".join(text) + f" (not judged: {why}, below the threshold {cfg.min_lds})",
                       numbers)  # fmt: skip
    passes, fails = V.margins_above(margins, family.z)
    return Verdict(V.three([passes], [fails]), ", ".join(text) + f"; {why}", numbers)


def _lds_cells(influence: pl.DataFrame, level: str, target: str) -> pl.DataFrame:
    """One row per planted (seed, draw, removal_percent, estimator) of the level's LDS, with its interval and
    margin over the log-only controls as columns."""
    rows = influence.filter(
        (pl.col("arm") == PLANTED)
        & (pl.col("level") == f"{level}_subset")
        & pl.col("target").is_in([target, "none"])
        & pl.col("metric").str.starts_with("lds")
        & (pl.col("metric") != "lds_pearson")
    )
    if not rows.height:
        return rows
    keys = ["seed", "draw", "removal_percent", "estimator"]
    return rows.pivot("metric", index=keys, values="value").sort(keys, nulls_last=False)


def _lds_cell(r: dict, limit: float, compare: bool, z: float) -> tuple[bool, bool]:
    margin = (r.get("lds_over_log_only"), r.get("lds_over_log_only_low"), r.get("lds_over_log_only_high"))
    compare = compare and margin[1] is not None
    passes = r["lds_low"] >= limit and (not compare or margin[1] > 0)
    fails = V.widened_high(r["lds"], r["lds_high"], z) < limit or (
        compare and V.widened_high(margin[0], margin[2], z) < 0
    )
    return bool(passes), bool(fails)


def lds_item(
    influence: pl.DataFrame | None,
    est: str,
    level: str,
    log_only: list[str],
    cfg: Checklist,
    family: V.Family = V.PER_CELL,
) -> Verdict:
    """Three-valued over the cells where the exact influence reaches the threshold (its LDS interval at or above
    it): elsewhere no method can be shown to pass. Where it reaches it in no cell, inconclusive: the cells exist
    but cannot judge. The exact influence's own row is judged on every cell: it is the item's positive control."""
    if influence is None:
        return Verdict(NA, "no exact influence computed")
    cells = _lds_cells(influence, level, cfg.effect_target_kind)
    if not cells.height:
        return Verdict(NA, f"no {level}-level LDS (influence.lds_levels, influence.lds_subsets)")
    limit = cfg.min_lds
    exact = cells.filter(pl.col("estimator") == "influence")
    open_, shut = [], []
    for r in exact.iter_rows(named=True):
        ok, _ = _lds_cell(r, limit, False, V.Z95)  # I's threshold alone: its margin is no property of the cell
        (open_ if ok else shut).append(r)
    shut_text = "; ".join(
        f"seed {r['seed']} {r['removal_percent']}%: I {r['lds']:.2f} [{r['lds_low']:.2f}, {r['lds_high']:.2f}]"
        for r in shut
    )
    own = cells.filter(pl.col("estimator") == est)
    if est != "influence":
        keep = pl.DataFrame(
            [{"seed": r["seed"], "removal_percent": r["removal_percent"]} for r in open_],
            schema={"seed": own.schema["seed"], "removal_percent": own.schema["removal_percent"]},
        )
        if not keep.height:
            return Verdict(
                INCONCLUSIVE,
                f"the exact influence itself does not reach the threshold {limit} in any cell, so no cell can judge "
                f"a method: {shut_text}",
                {"cells": 0, "tests": 0},
            )
        own = own.join(keep, on=["seed", "removal_percent"])
    own = own.filter(~pl.col("lds").is_nan()).sort("seed", "draw", "removal_percent")
    if not own.height:
        return Verdict(NA, f"no defined {level}-level LDS for this row (constant scores over the units)", {"cells": 0})
    compare = est not in log_only  # a log-only control is judged on the threshold alone
    lines, passes, fails = [], [], []
    log_rows = cells.filter(pl.col("estimator").is_in(log_only))
    for r in own.iter_rows(named=True):
        p, f = _lds_cell(r, limit, compare, family.z)
        passes.append(p)
        fails.append(f)
        over = ""
        if compare and r.get("lds_over_log_only") is not None:
            over = (
                f", over log-only {r['lds_over_log_only']:+.2f} [{r['lds_over_log_only_low']:+.2f}, "
                f"{r['lds_over_log_only_high']:+.2f}]"
            )
        strongest = log_rows.filter(
            (pl.col("seed") == r["seed"])
            & (pl.col("removal_percent") == r["removal_percent"])
            & ~pl.col("lds").is_nan()
        ).sort("lds", descending=True, nulls_last=True)
        bar = f"; strongest log-only {strongest['estimator'][0]} {strongest['lds'][0]:.2f}" if strongest.height else ""
        draw = "" if r["draw"] is None else f" draw {r['draw']}"
        power = f", power {r['lds_power']:.2f}" if r.get("lds_power") is not None else ""
        lines.append(
            f"seed {r['seed']}{draw} {r['removal_percent']}%: {r['lds']:.2f} [{r['lds_low']:.2f}, "
            f"{r['lds_high']:.2f}]{over}{bar}{power} -> {V.three([p], [f])}"
        )
    detail = f"LDS {'; '.join(lines)} (threshold {limit}; power: how often a method with the observed effect would "
    detail += "pass the cell at this design, by a double bootstrap of its subsets)"
    if shut and est != "influence":
        detail += f"; not judged where the exact influence does not pass: {shut_text}"
    return Verdict(
        V.three(passes, fails),
        detail,
        {
            "cells": len(passes),
            "tests": len(passes) * (2 if compare else 1),  # the threshold, and the margin over log-only
            **Counter(V.three([p], [f]) for p, f in zip(passes, fails, strict=True)),
        },
    )


# Assembly -----------------------------------------------------------------------------------------------------


def datamodel_unpowered(influence: pl.DataFrame, min_lds: float) -> str | None:
    """Why the datamodel is no row, where even an exactly additive truth would keep it below the threshold at the
    run's design in every cell (its `expected_lds`); None where it is powered somewhere."""
    expected = influence.filter((pl.col("estimator") == "datamodel") & (pl.col("metric") == "expected_lds"))
    if not expected.height or expected["value"].max() >= min_lds:
        return None
    return (
        f"The cross-fitted datamodel is no row: under an exactly additive truth it would reach an LDS of "
        f"{expected['value'].min():.2f} to {expected['value'].max():.2f} at this run's design (subsets per cell "
        f"against units), below the threshold {min_lds}; it cannot show that a method could pass."
    )


@dataclass
class Result:
    """The checklist of one run: its run items, each row's method items, each row's role, the family of method
    cells whose false FAILs are controlled, and each method item's positive control."""

    run: dict[str, Verdict]
    rows: dict[str, dict[str, Verdict]]
    roles: dict[str, str]
    family: V.Family
    positive: dict[str, str]
    notes: list[str] = field(default_factory=list)
    log_only: list[str] = field(default_factory=list)

    def log_passes(self, item: str) -> list[str]:
        """The log-only controls that pass `item`: a method's pass there is no attribution result."""
        return [name for name in self.log_only if name in self.rows and self.rows[name][item].verdict == PASS]

    @property
    def methods(self) -> list[str]:
        return [name for name, role in self.roles.items() if role == METHOD]

    def can_judge(self) -> tuple[bool, list[str]]:
        """Whether the run can judge methods: every run item passes or is n/a."""
        failing = [item for item, v in self.run.items() if v.verdict not in (PASS, NA)]
        return not failing, failing


def _method_row(est, metrics, stability, replayed, cfg, log_only, controls, influence, replicates, family) -> dict:
    target, stratum = cfg.target_kind, cfg.stratum
    step = ("step", cfg.step_metric, stratum)
    rollout = ("rollout", cfg.rollout_metric, stratum)
    return {
        "beats_norm_step": beats(metrics, est, ["norm"], [step], target, replicates, family),
        "beats_norm_rollout": beats(metrics, est, ["norm"], [rollout], target, replicates, family),
        "beats_fluency": beats(
            metrics,
            est,
            ["fluency"],
            [("rollout", cfg.fluency_metric, s) for s in cfg.fluency_strata],
            target,
            replicates,
            family,
            two_sided=True,
        ),
        **{f"beats_log_only_{lv}": beats_log_only(influence, est, log_only, cfg, family, lv) for lv in DENSE},
        "survives_fluency_residualization": survives_residualization(metrics, est, target, stratum, family, controls),
        "stable_across_draws": stable_across_draws(
            stability, metrics, est, target, stratum, cfg.min_draw_rank_correlation, cfg.max_draw_spread, family
        ),
        "stable_across_seeds": stable_across_seeds(metrics, est, target, stratum, cfg.max_seed_sd, family),
        "placebo_no_enrichment": placebo_no_enrichment(
            metrics, est, target, cfg.placebo_stratum, cfg.max_placebo_auc_gap, family
        ),
        "replay_beats_random": replay_beats_random(replayed, est, family),
        "tracks_effect": tracks_effect(metrics, est, cfg, family, controls),
        "tracks_step_removal": tracks_step_removal(influence, est, log_only, cfg, family),
    } | {item: lds_item(influence, est, item.removeprefix("lds_"), log_only, cfg, family) for item in LDS_ITEMS}


def build(
    metrics: pl.DataFrame,
    training: pl.DataFrame,
    shards: list[dict],
    stability: pl.DataFrame,
    replay: pl.DataFrame,
    cfg: Checklist,
    log_only: list[str],
    influence: pl.DataFrame | None = None,
    replicates: pl.DataFrame | None = None,
    controls: list[str] | None = None,
) -> Result:
    """The checklist. `log_only` and `controls` name the log-only and all target-free controls among the estimators
    (every other estimator is a method); `influence` is the exact-influence table (influence/table.py), None where
    none was computed; `replicates` the bootstrap replicates of the metrics (report/tables.py collect_metrics).

    Two passes: the first counts every method test (at 95% each), the second judges with FAIL controlled over all
    of them."""
    controls = sorted(set(controls or []) | set(log_only))
    replayed = window_end_probes(replay)
    replicates = replicate_index(replicates)
    run = {
        "sketch_covers_parameters": sketch_covers(shards, cfg.max_self_check_error),
        "behavior_emerged": behavior_emerged(training, cfg.min_behavior_gap, cfg.max_plain_rate),
        "headroom": headroom(metrics, cfg.min_unsaturated_paid_share),
        "random_at_chance": random_at_chance(metrics, cfg.alpha),
        "paid_unfindable_reported": paid_unfindable(metrics, cfg.max_unfindable_share),
        "replay_has_power": replay_has_power(replayed, cfg.min_label_drop),
    }
    names = estimators_of(metrics)
    roles = {name: CONTROL if name in controls else METHOD for name in names}
    args = (metrics, stability, replayed, cfg, log_only, controls, influence, replicates)
    first = {est: _method_row(est, *args, V.PER_CELL) for est in names if roles[est] == METHOD}
    family = V.Family(
        cfg.alpha,
        sum(v.numbers.get("tests", v.numbers.get("cells", 0)) for row in first.values() for v in row.values()),
    )
    rows = {est: _method_row(est, *args, family) for est in names}
    notes = []
    if influence is not None:
        present = set(influence["estimator"].unique().to_list())
        unpowered = datamodel_unpowered(influence, cfg.min_lds)
        if unpowered:
            present.discard("datamodel")
            notes.append(unpowered)
        reference = Verdict(NA, "a reference row: judged on the items that remove data only")
        for name in (n for n in REFERENCES if n in present):
            roles[name] = REFERENCE
            rows[name] = {item: reference for item in ITEMS} | {
                item: lds_item(influence, name, item.removeprefix("lds_"), log_only, cfg, family) for item in LDS_ITEMS
            }
            rows[name]["tracks_step_removal"] = tracks_step_removal(influence, name, log_only, cfg, family)
    positive = {}
    for item in ITEMS:
        passing = [name for name, row in rows.items() if row[item].verdict == PASS]
        positive[item] = ", ".join(passing) if passing else POSITIVE_CONTROL_TESTS[item]
    return Result(run, rows, roles, family, positive, notes, sorted(log_only))


LOG_TOO = "pass_log_only_too"  # a method's pass on an item that a log-only control passes as well


def counts(result: Result) -> dict[str, int]:
    """Verdicts on the method items of the methods only; a pass that a log-only control also earns is counted
    apart (LOG_TOO), never among the passes."""
    found = Counter(
        LOG_TOO if v.verdict == PASS and result.log_passes(item) else v.verdict
        for name in result.methods
        for item, v in result.rows[name].items()
    )
    return {k: found[k] for k in (PASS, LOG_TOO, FAIL, INCONCLUSIVE, NA)}


def headline(tally: dict[str, int]) -> str:
    return (
        f"{tally[PASS]} pass, {tally[LOG_TOO]} pass that a log-only control passes too, {tally[FAIL]} fail, "
        f"{tally[INCONCLUSIVE]} inconclusive, {tally[NA]} n/a"
    )


def to_json(result: Result, cfg: Checklist) -> str:
    ok, failing = result.can_judge()
    return json.dumps(
        {
            "thresholds": asdict(cfg),
            "run_items": RUN_ITEMS,
            "items": ITEMS,
            "run": {item: asdict(v) for item, v in result.run.items()},
            "can_judge_methods": ok,
            "run_items_not_passed": failing,
            "roles": result.roles,
            "family": {"alpha": result.family.alpha, "method_tests": result.family.tests, "z": result.family.z},
            "positive_controls": result.positive,
            "notes": result.notes,
            "counts": counts(result),
            "estimators": {e: {i: asdict(v) for i, v in row.items()} for e, row in result.rows.items()},
        },
        indent=2,
        default=float,
    )


def _mark(verdict: str, role: str, log_too: bool = False) -> str:
    mark = {PASS: "pass", FAIL: "**FAIL**", INCONCLUSIVE: "inconclusive", NA: "n/a"}[verdict]
    if verdict == PASS and log_too and role == METHOD:
        mark = "pass, log too"
    return mark if role == METHOD or verdict == NA else f"({mark})"


def to_markdown(result: Result, cfg: Checklist, run: str, semantics: str | None = None) -> str:
    """The checklist page; `semantics` (influence.semantics) is what removing a rollout meant for the causal items."""
    items = list(ITEMS)
    ok, failing = result.can_judge()
    tally = counts(result)
    order = sorted(result.rows, key=lambda n: ({METHOD: 0, REFERENCE: 1, CONTROL: 2}[result.roles[n]], n))
    shared = {i: bool(result.log_passes(i)) for i in items}
    rows = [[name, result.roles[name], *[_mark(result.rows[name][i].verdict, result.roles[name], shared[i])
                                         for i in items]] for name in order]  # fmt: skip
    verdict = "yes" if ok else f"no: {', '.join(f'`{i}`' for i in failing)} did not pass"
    parts = [
        f"# Attribution checklist — run `{run}`\n",
        f"## Can this run judge methods? {verdict}\n",
        "Run items say whether the experiment can support any claim; each is judged once.\n",
        markdown_table(
            ["item", "verdict", "numbers"],
            [[f"`{i}`", result.run[i].verdict, result.run[i].detail] for i in RUN_ITEMS],
        ),
        f"## Methods ({headline(tally)})\n",
        f"Methods ({', '.join(result.methods) or 'none'}) are judged and counted. Controls are the bars a method "
        "must clear and references the exact influence (positive) and earlier-is-more (negative): their verdicts, "
        "in parentheses, are reference only. A method's pass on an item that a log-only control (the rollout log "
        "alone) passes as well is marked `pass, log too` and counted apart: a look-up of the reward log earns it, "
        "so it is no attribution result. Targeted estimators are judged with the "
        f"`{cfg.target_kind}` target, in stratum `{cfg.stratum}` unless an item says otherwise. Pass needs every "
        f"cell at 95%; FAIL needs evidence at the family-wise α = {cfg.alpha} over the {result.family.tests} method "
        f"tests (intervals widened to z = {result.family.z:.2f}); the rest is inconclusive."
        + (
            f" Removing a rollout (`replay_has_power`, items "
            f"{', '.join(str(items.index(i) + 1) for i in CAUSAL_ITEMS)}) means "
            f"`{semantics}` (docs/influence.md).\n"
            if semantics
            else "\n"
        ),
        markdown_table(["row", "role", *[f"{n + 1}" for n in range(len(items))]], rows),
        *[f"{note}\n" for note in result.notes],
        "### Items\n",
    ]
    parts += [
        f"{n + 1}. `{item}`: {ITEMS[item]}. Positive control: {result.positive[item]}." for n, item in enumerate(items)
    ]
    parts.append("\n### Thresholds (config key `checklist`)\n")
    parts += [f"- `{k}`: {v}" for k, v in asdict(cfg).items()]
    parts.append("\n## The numbers behind each verdict\n")
    for n, item in enumerate(items):
        parts.append(f"### {n + 1}. `{item}`\n")
        details = {name: result.rows[name][item] for name in order}
        if len({(v.verdict, v.detail) for v in details.values()}) == 1:
            v = next(iter(details.values()))
            parts.append(f"- every row ({v.verdict}): {v.detail}")
        else:
            parts += [f"- {name} ({result.roles[name]}, {v.verdict}): {v.detail}" for name, v in details.items()]
        parts.append("")
    return "\n".join(parts)
