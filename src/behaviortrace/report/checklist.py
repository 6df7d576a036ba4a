"""The attribution checklist: each estimator against each item, pass / fail / inconclusive / n/a, with the
numbers behind every verdict (inconclusive: an interval of the evidence straddles the threshold, on the items
judged by intervals: beating a control, the residualized AUC, the measured effect, the LDS). Thresholds come
from the config's `checklist` section and are printed with the checklist.

Run-level items (the sketch, the behavior, headroom, the random control, unfindable paid rollouts, the power of the
leave-out replay) say whether the experiment can support any claim; they get the same verdict on every
estimator's row.

Items that pass when no seed or draw departs from a null (the random control, the placebo) control the
family-wise error over their checks with Holm's procedure (report/significance.py); items that pass when every
cell beats a control are intersection-union tests and need no correction.
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
from behaviortrace.replay.table import window_end_probes
from behaviortrace.report.significance import holm
from behaviortrace.report.tables import PLACEBO, PLANTED, beats_table, estimators_of, judged

PASS, FAIL, INCONCLUSIVE, NA = "pass", "fail", "inconclusive", "n/a"
# Rows beside the estimators, judged on the LDS items only: the exact influence and the cross-fitted datamodel
# (positive controls: faithful where training is smooth) and earlier-is-more (a negative one: minus the step).
REFERENCES = ("influence", "datamodel", "earlier")
LDS_ITEMS = ("lds_rollout", "lds_group")
CAUSAL_ITEMS = ("replay_has_power", "replay_beats_random", *LDS_ITEMS)  # those that remove rollouts
ITEMS = {
    "sketch_covers_parameters": "The sketch covers every trainable parameter, and per-rollout sketches add up to "
    "the step gradient's sketch (self-check): on every step against TRL's own gradient with train-time capture, "
    "on one step per shard when sketching from checkpoints",
    "behavior_emerged": "The behavior emerged: probe minus control behavior rate at the end of the window, and "
    "controls low at every checkpoint",
    "headroom": "Evaluated where there is headroom: share of paid rollouts generated at checkpoints below saturation",
    "beats_norm_step": "Beats the norm control at step level on every seed and draw (non-overlapping intervals; "
    "norm at its strongest step variant)",
    "beats_norm_rollout": "Beats the norm control at rollout level on every seed and draw",
    "beats_fluency": "Beats the fluency control at rollout level on every seed and draw, in every listed stratum, "
    "fluency taken both ways (max(AUC, 1 - AUC): a reversed predictor predicts as well)",
    "beats_log_only": "Beats the log-only controls (the rollout log alone: advantage, reward, behavior, "
    "behavior_advantage; at step level also the step's reward variance, share of active groups, and whether it "
    "paid) at step and rollout level on every seed and draw: its interval wholly above that of the strongest of "
    "them, on the metrics of the norm items",
    "survives_fluency_residualization": "Within-group AUC after residualizing on fluency has its interval above "
    "0.5 on every seed and draw",
    "stable_across_draws": "Stable across generation draws: rank correlation of rollout scores between draws (its "
    "interval from a bootstrap over training steps), and the spread of the residualized within-group AUC across "
    "draws, as far as the draws' intervals allow",
    "stable_across_seeds": "Stable across seeds: sd of the residualized within-group AUC across seeds, as far as "
    "the seeds' intervals allow, and every seed agreeing on whether its interval is above 0.5",
    "random_at_chance": "The random control is at chance on every seed and draw: its rollout lift, AUROC and step "
    "lift are consistent with a random ordering (two-sided hypergeometric, Mann-Whitney and step-permutation tests), "
    "Holm's procedure over every check at the family-wise error `alpha`",
    "placebo_no_enrichment": "No enrichment in the placebo run (no bonus paid), judged where the label is a "
    "coin flip: among the placebo's rollouts that show the behavior with the trigger, in the `placebo_stratum`, "
    "the eligible ones (a hash that training never saw) are not ranked above the rest, by the behavior-matched "
    "AUC (Mann-Whitney) and step lift (step permutations); one-sided tests, Holm over every cell at `alpha`",
    "paid_unfindable_reported": "paid rollouts unfindable by construction (advantage 0) are counted, and their share "
    "is small",
    "replay_has_power": "The causal check has power: leaving out the paid set (as `influence.semantics` says) and "
    "retraining lowers the probe behavior "
    "rate at the window's end by at least the threshold, and more than every removal of as "
    "many rollouts at random from the same steps, on every seed and k; fails where a cell's drop is short of the "
    "threshold or no larger than the random removals' mean",
    "replay_beats_random": "Removing its top-scored rollouts and retraining lowers the probe behavior rate at the "
    "window's end more than every removal of k rollouts at random from the same steps, on every seed and k; fails "
    "where in some cell it lowers it no more than the random removals do on average",
    "tracks_effect": "Step scores track the measured behavior change: correlation of each step's score with the "
    "measured change of the forced target's log-prob across that step's update, on every seed and draw (beside "
    "it, the same correlation for the number of ground-truth rollouts per step)",
    "lds_rollout": "Predicts what removing rollouts does: the LDS over random subsets of rollouts before the "
    "influence checkpoint, retrained with them removed as `influence.semantics` says (targeted estimators at "
    "`effect_target_kind`), has its "
    "interval at or above the threshold and, for an estimator that is not log-only, its margin over the strongest "
    "log-only control above 0, on every planted seed, draw and subset size. Fails where an interval lies wholly on "
    "the wrong side; n/a where even the exact influence and the datamodel lie wholly below the threshold (not "
    "attributable at this level in this regime)",
    "lds_group": "The same over random subsets of whole groups (removed through the advantages, a group is its "
    "prompt never sampled)",
}


@dataclass
class Verdict:
    verdict: str
    detail: str
    numbers: dict = field(default_factory=dict)


def _ci(row: dict) -> str:
    return f"{row['value']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"


def _all(flags) -> str:
    return PASS if all(flags) else FAIL


def _three(passes: list[bool], fails: list[bool]) -> str:
    """Every cell clears: pass; one lies wholly on the wrong side: fail; otherwise the intervals straddle."""
    return FAIL if any(fails) else PASS if all(passes) else INCONCLUSIVE


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


# Run-level items -------------------------------------------------------------------------------------------


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
    return Verdict(
        _all([*(g >= min_gap for g in gaps.values()), *(p <= max_control for p in peaks.values())]),
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
    rejected = holm([p for _, p in checks], alpha)
    off = [f"{what} (p = {p:.2g})" for (what, p), r in zip(checks, rejected, strict=True) if r]
    what, p = min(checks, key=lambda c: c[1] if c[1] == c[1] else 2.0)
    held = f"{len(checks) - len(off)}/{len(checks)} checks hold at family-wise α = {alpha} (Holm)"
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


# Per-estimator items ---------------------------------------------------------------------------------------


def beats(
    metrics: pl.DataFrame,
    est: str,
    controls: list[str],
    comparisons: list[tuple[str, str, str]],
    target: str,
    two_sided: bool = False,
) -> Verdict:
    """The estimator's interval wholly above the strongest control's in every cell of every (level, metric,
    stratum) comparison; with `two_sided`, the controls taken both ways (an AUC of 0.3 counts as 0.7)."""
    if est in controls:
        return Verdict(NA, "is the control" if len(controls) == 1 else "is one of the controls")
    cells, below, lines = [], [], []
    for level, metric, stratum in comparisons:
        t = beats_table(metrics, est, controls, level, metric, stratum, target, two_sided)
        if not t.height:
            continue
        cells += t["beats"].to_list()
        below += t["below"].to_list()
        worst = t.sort(pl.col("ci_low") - pl.col("control_high")).row(0, named=True)
        lines.append(
            f"{level} {metric}, {stratum}: {int(t['beats'].sum())}/{t.height} seed × draw cells; closest: seed "
            f"{worst['seed']} draw {worst['draw']} {_ci(worst)} vs {worst['control']} upper "
            f"{worst['control_high']:.3f}"
        )
    if not cells:
        levels = ", ".join(sorted({level for level, _, _ in comparisons}))
        return Verdict(NA, f"no {levels}-level metrics for {est} or the controls")
    return Verdict(
        _three(cells, below),
        "; ".join(lines),
        {"cells": len(cells), "beaten": int(sum(cells)), "wholly_below": int(sum(below))},
    )


def survives_residualization(metrics: pl.DataFrame, est: str, target: str, stratum: str) -> Verdict:
    rows = _resid_auc(metrics, est, target, stratum)
    if not rows.height:
        return Verdict(NA, "no residualized within-group AUC")
    worst = rows.sort("ci_low").row(0, named=True)
    return Verdict(
        _three([v > 0.5 for v in rows["ci_low"].to_list()], [v < 0.5 for v in rows["ci_high"].to_list()]),
        f"{int((rows['ci_low'] > 0.5).sum())}/{rows.height} cells above 0.5; lowest: seed {worst['seed']} "
        f"draw {worst['draw']} {_ci(worst)}",
        {"lowest_ci_low": worst["ci_low"]},
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


def stable_across_draws(stability: pl.DataFrame, est: str, target: str, min_corr: float, max_spread: float) -> Verdict:
    """Pass where the rank correlation's interval clears `min_corr` and the largest spread the draws' intervals
    allow stays within `max_spread`; fail where the correlation's interval lies wholly below, or the smallest
    spread they allow is above; inconclusive in between."""
    rows = stability.filter((pl.col("estimator") == est) & pl.col("target").is_in([target, "none"]))
    if not rows.height or rows["draws"].min() < 2:
        return Verdict(NA, "fewer than two generation draws")
    worst = rows.sort("rank_correlation_min").row(0, named=True)
    corr, low, high = (worst[f"rank_correlation_min{s}"] for s in ("", "_ci_low", "_ci_high"))
    spread_low = float(rows["within_group_auc_fluency_resid_rollout_spread_low"].max())
    spread_high = float(rows["within_group_auc_fluency_resid_rollout_spread_high"].max())
    spread = float(rows["within_group_auc_fluency_resid_rollout_spread"].max())
    passes = low >= min_corr and spread_high <= max_spread
    fails = high < min_corr or spread_low > max_spread
    return Verdict(
        _three([passes], [fails]),
        f"lowest rank correlation between draws {corr:.3f} [{low:.3f}, {high:.3f}] (at least {min_corr}); "
        f"largest spread of residualized AUC {spread:.3f}, {spread_low:.3f} to {spread_high:.3f} within the draws' "
        f"intervals (at most {max_spread})",
        {"rank_correlation_min": corr, "resid_auc_spread_max": spread},
    )


def stable_across_seeds(metrics: pl.DataFrame, est: str, target: str, stratum: str, max_sd: float) -> Verdict:
    """Pass where the largest sd the seeds' intervals allow is within `max_sd` and the seeds agree on whether the
    AUC is above 0.5 (every one above, or none); fail where the smallest sd they allow is above `max_sd`, or one
    seed is wholly above 0.5 and another wholly below; inconclusive in between (a seed above, another
    straddling)."""
    by_seed = (
        _resid_auc(metrics, est, target, stratum)
        .group_by("seed")
        .agg(
            pl.col("value").mean(),
            pl.col("ci_low").mean(),
            pl.col("ci_high").mean(),
            (pl.col("ci_low") > 0.5).all().alias("above"),
            (pl.col("ci_high") < 0.5).all().alias("below"),
        )
        .sort("seed")
    )
    if by_seed.height < 2:
        return Verdict(NA, "fewer than two seeds")
    sd = float(by_seed["value"].std())
    sd_low, sd_high = sd_range(by_seed["ci_low"].to_numpy(), by_seed["ci_high"].to_numpy())
    above, below = int(by_seed["above"].sum()), int(by_seed["below"].sum())
    agree = above in (0, by_seed.height)
    passes = sd_high <= max_sd and agree
    fails = sd_low > max_sd or (above > 0 and below > 0)
    values = ", ".join(f"{v:.3f}" for v in by_seed["value"].to_list())
    return Verdict(
        _three([passes], [fails]),
        f"residualized AUC by seed {values}: sd {sd:.3f}, {sd_low:.3f} to {sd_high:.3f} within the seeds' "
        f"intervals (at most {max_sd}); interval above 0.5 on {above}/{by_seed.height} seeds and below on {below} "
        "(all or none above to agree)",
        {"sd": sd, "agree": agree},
    )


def placebo_no_enrichment(metrics: pl.DataFrame, est: str, target: str, stratum: str, alpha: float) -> Verdict:
    """In a placebo, eligibility is a hash of (seed, rollout id, step) that training never saw, so among the
    rollouts that show the behavior with the trigger it is a coin flip: a faithful estimator ranks the eligible
    ones at chance however strongly it responds to the behavior itself."""
    if not metrics.filter(pl.col("arm") == PLACEBO).height:
        return Verdict(NA, "no placebo run configured (placebo.enabled: false)")
    rows = judged(metrics, target, stratum, arm=PLACEBO).filter(pl.col("estimator") == est)
    checks = []
    for seed, draw, m in _cells(rows):
        auc, auc_p = m.get(("rollout", "behavior_matched_auc")), m.get(("rollout", "behavior_matched_auc_p"))
        step, band = m.get(("step", "behavior_matched_lift")), m.get(("step", "behavior_matched_lift_chance_band"))
        step_p = m.get(("step", "behavior_matched_lift_p"))
        cell = f"seed {seed} draw {draw}"
        if auc and auc_p:
            checks.append((f"{cell}: AUC {_ci(auc)}", auc_p["value"]))
        if step and band and step_p:
            checks.append((f"{cell}: step lift {step['value']:.2f} vs null {_ci(band)}", step_p["value"]))
    if not checks:
        return Verdict(NA, f"no placebo rollouts showing the behavior with the trigger, eligible and not, in {stratum}")
    off, line = _against_null(checks, alpha)
    shown = "; ".join(what for what, _ in checks)
    detail = f"{line}; {shown}" if not off else f"enriched: {'; '.join(off)}; {line}"
    return Verdict(PASS if not off else FAIL, detail, {"checks": len(checks), "enriched": off, "alpha": alpha})


def _against_random(s: pl.DataFrame, removal: str) -> pl.DataFrame:
    """Per seed and k, from the replay summary at the window's end on probes: the change in probe rate when
    `removal`'s set is left out, beside the most negative and the mean change of the random sets step-matched to
    it. `below_random`: below every one of them; `no_better`: at or above their mean (no better than a typical
    random set of its steps)."""
    rand = s.filter((pl.col("removal") == "random") & (pl.col("matched_to") == removal)).select(
        "seed", "removal_percent", random_low=pl.col("change_low"), random_mean=pl.col("change"), random_reps="reps"
    )
    return (
        s.filter((pl.col("removal") == removal) & pl.col("matched_to").is_null())
        .join(rand, on=["seed", "removal_percent"], how="inner")
        .with_columns(
            below_random=pl.col("change") < pl.col("random_low"),
            no_better=pl.col("change") >= pl.col("random_mean"),
        )
        .sort("seed", "removal_percent")
    )


def _replay_text(both: pl.DataFrame, name: str) -> str:
    """Each cell's numbers, and how often every cell would pass by chance if the set were no better than its
    random matches (it is then below all R of them with probability 1 / (R + 1) per cell)."""
    cells = "; ".join(
        f"seed {r['seed']} removal {r['removal_percent']}%: {name}{r['change']:+.3f} "
        f"vs random lowest {r['random_low']:+.3f}, mean {r['random_mean']:+.3f}"
        for r in both.iter_rows(named=True)
    )
    chance = float(np.prod(1.0 / (both["random_reps"].to_numpy() + 1.0)))
    return f"{cells} (a set no better than random passes every cell with probability {chance:.1e})"


def replay_has_power(s: pl.DataFrame, min_drop: float) -> Verdict:
    """The oracle's change against the threshold and against every random removal. Without it the
    estimators' replay item means nothing: a replay that any removal derails ranks every set as causal."""
    both = _against_random(s, "oracle")
    if not both.height:
        return Verdict(NA, "no oracle and random replays to compare")
    ok = (both["below_random"] & (both["change"] <= -min_drop)).to_list()
    short = (both["no_better"] | (both["change"] > -min_drop)).to_list()
    return Verdict(
        _three(ok, short),
        f"{_replay_text(both, 'oracle ')}; oracle at most {-min_drop:+.2f} and below every random removal to pass, "
        "above the threshold or at or above the random mean in a cell to fail, otherwise inconclusive",
        {"cells": len(ok), "with_power": int(sum(ok))},
    )


def replay_beats_random(s: pl.DataFrame, est: str) -> Verdict:
    """The estimator's change against every random removal."""
    if est == "random":  # its top-scored set are k rollouts at random: the baseline itself
        return Verdict(NA, "is the random baseline")
    if not s.filter(pl.col("removal") == est).height:
        return Verdict(NA, "not replayed (replay.estimators)")
    both = _against_random(s, est)
    if not both.height:
        return Verdict(NA, "no random replay to compare with")
    ok = both["below_random"].to_list()
    return Verdict(
        _three(ok, both["no_better"].to_list()),
        f"{_replay_text(both, '')}; below every random removal to pass, at or above the random mean in a cell to "
        "fail, otherwise inconclusive",
        {"cells": len(ok), "beaten": int(sum(ok))},
    )


def tracks_effect(metrics: pl.DataFrame, est: str, cfg: Checklist) -> Verdict:
    """The estimator's effect correlation on every seed and draw, shown beside that of the labels' count."""
    effect = judged(metrics, cfg.effect_target_kind, cfg.stratum).filter(pl.col("level") == "effect")
    rows = effect.filter(pl.col("metric") == cfg.effect_metric)
    own = rows.filter(pl.col("estimator") == est).sort("seed", "draw")
    given = effect.filter((pl.col("metric") == "effect_spearman_given_step") & (pl.col("estimator") == est))
    if not own.height:
        return Verdict(NA, "no measured effect to compare with (step log without target_change)")
    labels = rows.filter(pl.col("estimator") == "paid_per_step").sort("seed", "draw")
    limit = cfg.min_effect_correlation
    ok = [v is not None and v >= limit for v in own["ci_low"].to_list()]
    below = [v is None or v < limit for v in own["ci_high"].to_list()]
    text = "; ".join(f"seed {r['seed']} draw {r['draw']}: {_ci(r)}" for r in own.iter_rows(named=True))
    paid = ", ".join(f"{v:.2f}" for v in labels.unique(["seed", "draw"], maintain_order=True)["value"].to_list())
    return Verdict(
        _three(ok, below),
        f"{cfg.effect_metric} {text} (interval at least {limit}); given the step number: "
        f"{', '.join(f'{v:.2f}' for v in given.sort('seed', 'draw')['value'].to_list())}; paid count per step: {paid}",
        {"cells": len(ok), "tracking": int(sum(ok)), "values": own["value"].to_list()},
    )


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


def lds_item(influence: pl.DataFrame | None, est: str, level: str, log_only: list[str], cfg: Checklist) -> Verdict:
    """Three-valued: pass where every cell's interval clears the threshold (and the margin over the log-only
    controls clears 0), fail where one lies wholly below, inconclusive otherwise. Cells where the ceiling (the
    exact influence and the datamodel) lies wholly below the threshold, or wholly below a log-only control, are
    not judged: no attribution could be shown to pass there."""
    if influence is None:
        return Verdict(NA, "no exact influence computed")
    cells = _lds_cells(influence, level, cfg.effect_target_kind)
    if not cells.height:
        return Verdict(NA, f"no {level}-level LDS (influence.lds_levels, influence.lds_subsets)")
    limit = cfg.min_lds
    # The ceiling of a cell: the better of I and the datamodel, on the LDS and on the margin over the log-only.
    ceiling = (
        cells.filter(pl.col("estimator").is_in(["influence", "datamodel"]))
        .group_by("seed", "removal_percent")
        .agg(
            pl.col("lds").max().alias("ceiling"),
            (pl.col("lds_high").max() >= limit).alias("reaches"),
            (pl.col("lds_over_log_only_high").max() >= 0).fill_null(True).alias("beats_log"),
        )
        .with_columns(open=pl.col("reaches") & pl.col("beats_log"))
    )
    attributable = ceiling.filter(pl.col("open"))
    shut = ceiling.filter(~pl.col("open")).sort("seed", "removal_percent")
    shut_text = ", ".join(
        f"seed {r['seed']} {r['removal_percent']}% (ceiling {r['ceiling']:.2f}"
        + ("" if r["reaches"] else " below the threshold")
        + ("" if r["beats_log"] else ", below a log-only control")
        + ")"
        for r in shut.iter_rows(named=True)
    )
    if not attributable.height:
        return Verdict(NA, f"not attributable at this level in this regime: {shut_text} (threshold {limit})")
    own = (
        cells.filter(pl.col("estimator") == est)
        .join(attributable.select("seed", "removal_percent"), on=["seed", "removal_percent"])
        .sort("seed", "draw", "removal_percent")
    )
    if not own.height:
        return Verdict(NA, f"no {level}-level LDS for this estimator")
    # A score constant over the units (a step-level control where every step before T is alike) ranks no
    # subset: its LDS is undefined, which says nothing either way.
    own = own.filter(~pl.col("lds").is_nan())
    if not own.height:
        return Verdict(NA, f"the {level}-level LDS is undefined: the scores are constant over the units before T")
    judged_alone = est in log_only  # a log-only control is judged on the threshold alone
    passes, fails, verdicts, lines = [], [], [], []
    for r in own.iter_rows(named=True):
        margin = (r.get("lds_over_log_only_low"), r.get("lds_over_log_only_high"))
        compare = not judged_alone and margin[0] is not None
        passes.append(r["lds_low"] >= limit and (not compare or margin[0] > 0))
        fails.append(r["lds_high"] < limit or (compare and margin[1] < 0))
        verdicts.append(_three(passes[-1:], fails[-1:]))
        over = f", over log-only {r['lds_over_log_only']:+.2f} [{margin[0]:+.2f}, {margin[1]:+.2f}]" if compare else ""
        draw = "" if r["draw"] is None else f" draw {r['draw']}"
        lines.append(
            f"seed {r['seed']}{draw} {r['removal_percent']}%: {r['lds']:.2f} [{r['lds_low']:.2f}, "
            f"{r['lds_high']:.2f}]{over} -> {verdicts[-1]}"
        )
    verdict = _three(passes, fails)
    detail = f"LDS {'; '.join(lines)} (threshold {limit})"
    if shut.height:
        detail += f"; not judged where the ceiling cannot pass: {shut_text}"
    return Verdict(verdict, detail, {"cells": len(verdicts), **Counter(verdicts)})


# Assembly -------------------------------------------------------------------------------------------------


def build(
    metrics: pl.DataFrame,
    training: pl.DataFrame,
    shards: list[dict],
    stability: pl.DataFrame,
    replay: pl.DataFrame,
    cfg: Checklist,
    log_only: list[str],
    influence: pl.DataFrame | None = None,
) -> dict[str, dict[str, Verdict]]:
    """{estimator: {item: Verdict}} for every item in ITEMS; `log_only` names the log-only controls; `influence`
    is the exact-influence table (influence/table.py), None where none was computed."""
    target, stratum = cfg.target_kind, cfg.stratum
    replayed = window_end_probes(replay)
    run_level = {
        "sketch_covers_parameters": sketch_covers(shards, cfg.max_self_check_error),
        "behavior_emerged": behavior_emerged(training, cfg.min_behavior_gap, cfg.max_plain_rate),
        "headroom": headroom(metrics, cfg.min_unsaturated_paid_share),
        "random_at_chance": random_at_chance(metrics, cfg.alpha),
        "paid_unfindable_reported": paid_unfindable(metrics, cfg.max_unfindable_share),
        "replay_has_power": replay_has_power(replayed, cfg.min_oracle_drop),
    }
    table = {}
    for est in estimators_of(metrics):
        row = {
            "beats_norm_step": beats(metrics, est, ["norm"], [("step", cfg.step_metric, stratum)], target),
            "beats_norm_rollout": beats(metrics, est, ["norm"], [("rollout", cfg.rollout_metric, stratum)], target),
            "beats_fluency": beats(
                metrics,
                est,
                ["fluency"],
                [("rollout", cfg.fluency_metric, s) for s in cfg.fluency_strata],
                target,
                two_sided=True,
            ),
            "beats_log_only": beats(
                metrics,
                est,
                log_only,
                [("step", cfg.step_metric, stratum), ("rollout", cfg.rollout_metric, stratum)],
                target,
            )
            if log_only
            else Verdict(NA, "no log-only control configured"),
            "survives_fluency_residualization": survives_residualization(metrics, est, target, stratum),
            "stable_across_draws": stable_across_draws(
                stability, est, target, cfg.min_draw_rank_correlation, cfg.max_draw_spread
            ),
            "stable_across_seeds": stable_across_seeds(metrics, est, target, stratum, cfg.max_seed_sd),
            "placebo_no_enrichment": placebo_no_enrichment(metrics, est, target, cfg.placebo_stratum, cfg.alpha),
            "replay_beats_random": replay_beats_random(replayed, est),
            "tracks_effect": tracks_effect(metrics, est, cfg),
        } | {item: lds_item(influence, est, item.removeprefix("lds_"), log_only, cfg) for item in LDS_ITEMS}
        table[est] = {item: (run_level | row)[item] for item in ITEMS}
    if influence is not None:
        reference = Verdict(NA, "a reference row: judged on the run-level and LDS items only")
        for name in REFERENCES:
            table[name] = (
                {item: reference for item in ITEMS}
                | run_level
                | {item: lds_item(influence, name, item.removeprefix("lds_"), log_only, cfg) for item in LDS_ITEMS}
            )
    return table


def to_json(table: dict[str, dict[str, Verdict]], cfg: Checklist) -> str:
    return json.dumps(
        {
            "thresholds": asdict(cfg),
            "items": ITEMS,
            "estimators": {e: {i: asdict(v) for i, v in row.items()} for e, row in table.items()},
        },
        indent=2,
        default=float,
    )


def to_markdown(table: dict[str, dict[str, Verdict]], cfg: Checklist, run: str, semantics: str | None = None) -> str:
    """The checklist page; `semantics` (influence.semantics) is what removing a rollout meant for the causal items."""
    items = list(ITEMS)
    mark = {PASS: "pass", FAIL: "**FAIL**", INCONCLUSIVE: "inconclusive", NA: "n/a"}
    rows = [[est, *[mark[table[est][i].verdict] for i in items]] for est in table]
    parts = [
        f"# Attribution checklist — run `{run}`\n",
        f"Targeted estimators are judged with the `{cfg.target_kind}` target, in stratum `{cfg.stratum}` "
        "unless an item says otherwise. Columns are numbered; the items and the numbers behind each verdict "
        "follow the table."
        + (
            f" Removing a rollout (items {', '.join(str(items.index(i) + 1) for i in CAUSAL_ITEMS)}) means "
            f"`{semantics}` (docs/influence.md).\n"
            if semantics
            else "\n"
        ),
        markdown_table(["estimator", *[f"{n + 1}" for n in range(len(items))]], rows),
        "## Items\n",
    ]
    parts += [f"{n + 1}. `{item}`: {ITEMS[item]}." for n, item in enumerate(items)]
    parts.append("\n## Thresholds (config key `checklist`)\n")
    parts += [f"- `{k}`: {v}" for k, v in asdict(cfg).items()]
    parts.append("\n## The numbers behind each verdict\n")
    for n, item in enumerate(items):
        parts.append(f"### {n + 1}. `{item}`\n")
        details = {est: table[est][item] for est in table}
        if len({(v.verdict, v.detail) for v in details.values()}) == 1:
            v = next(iter(details.values()))
            parts.append(f"- every estimator ({v.verdict}): {v.detail}")
        else:
            parts += [f"- {est} ({v.verdict}): {v.detail}" for est, v in details.items()]
        parts.append("")
    return "\n".join(parts)


def verdict_counts(table: dict[str, dict[str, Verdict]]) -> dict[str, int]:
    counts = Counter(v.verdict for row in table.values() for v in row.values())
    return {k: counts[k] for k in (PASS, FAIL, INCONCLUSIVE, NA)}
