"""Every method item of the checklist is passable: a faithful estimator passes it and a negative control fails it,
on inputs of the shapes the workflow writes (metric rows with their bootstrap replicates, the stability table, the
replay summary, the influence table). The checklist names these tests as the positive control of an item that no
row of a run passes."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from behaviortrace.config.sections import Checklist
from behaviortrace.report import checklist as C
from behaviortrace.report import verdicts as V

CFG = Checklist()
SEEDS, DRAWS, B = (0, 1, 2), (0, 1), 200


def _row(est, target, level, metric, value, low, high, seed, draw, arm="planted", stratum="all", n=100):
    return {
        "run": "t",
        "arm": arm,
        "seed": seed,
        "draw": draw,
        "estimator": est,
        "target": target,
        "level": level,
        "stratum": stratum,
        "metric": metric,
        "value": float(value),
        "ci_low": float(low),
        "ci_high": float(high),
        "n": n,
    }


class Cells:
    """Metric rows and their bootstrap replicates, drawn around given values with a shared resample effect per cell
    (what resampling the same prompt groups does to every estimator of a cell)."""

    def __init__(self, seed=0):
        self.rows, self.replicates = [], []
        self.rng = np.random.default_rng(seed)
        self.shared = {}

    def add(self, est, target, level, metric, value, sd=0.02, stratum="all", arm="planted"):
        for seed in SEEDS:
            for draw in DRAWS:
                key = (arm, seed, draw, level, stratum, metric)
                common = self.shared.setdefault(key, self.rng.normal(0, sd, B))
                reps = value + 0.8 * common + self.rng.normal(0, 0.6 * sd, B)
                low, high = np.percentile(reps, [2.5, 97.5])
                row = _row(est, target, level, metric, value, low, high, seed, draw, arm, stratum)
                self.rows.append(row)
                self.replicates.append({**{k: row[k] for k in C.KEYS}, "replicates": reps.tolist()})
        return self

    @property
    def metrics(self):
        return pl.DataFrame(self.rows)

    @property
    def index(self):
        return C.replicate_index(pl.DataFrame(self.replicates))


def _beats(cells, est, controls, comparisons, two_sided=False):
    return C.beats(cells.metrics, est, controls, comparisons, "in_context", cells.index, two_sided=two_sided)


def test_beats_norm_step():
    cells = (
        Cells().add("faithful", "in_context", "step", "lift", 3.0, 0.1).add("norm", "none", "step", "lift", 1.5, 0.1)
    )
    cells.add("norm", "none", "step_summed", "lift", 1.4, 0.1).add("negative", "in_context", "step", "lift", 1.0, 0.1)
    assert _beats(cells, "faithful", ["norm"], [("step", "lift", "all")]).verdict == C.PASS
    assert _beats(cells, "negative", ["norm"], [("step", "lift", "all")]).verdict == C.FAIL


def test_beats_norm_rollout():
    cells = Cells().add("faithful", "in_context", "rollout", "within_group_auc", 0.8)
    cells.add("norm", "none", "rollout", "within_group_auc", 0.6).add(
        "negative", "in_context", "rollout", "within_group_auc", 0.45
    )
    assert _beats(cells, "faithful", ["norm"], [("rollout", "within_group_auc", "all")]).verdict == C.PASS
    assert _beats(cells, "negative", ["norm"], [("rollout", "within_group_auc", "all")]).verdict == C.FAIL


def test_beats_fluency():
    """Fluency at 0.2 ranks as well as 0.8 reversed: 0.7 does not beat it, 0.9 does."""
    cells = Cells()
    for stratum in CFG.fluency_strata:
        cells.add("faithful", "in_context", "rollout", "auroc", 0.9, stratum=stratum)
        cells.add("negative", "in_context", "rollout", "auroc", 0.7, stratum=stratum)
        cells.add("fluency", "none", "rollout", "auroc", 0.2, stratum=stratum)
    comparisons = [("rollout", "auroc", s) for s in CFG.fluency_strata]
    assert _beats(cells, "faithful", ["fluency"], comparisons, two_sided=True).verdict == C.PASS
    assert _beats(cells, "negative", ["fluency"], comparisons, two_sided=True).verdict == C.FAIL


def _dense(rows_by_estimator: dict, exact_lds_low: float = 0.8) -> pl.DataFrame:
    """Influence-table rows of the dense endpoint (per estimator: agreement, its margin over the strongest log-only
    control and over random, each (value, low, high)) and I's own LDS pooled over seeds at both levels."""
    out = []
    for est, values in rows_by_estimator.items():
        target = "none" if est in ("reward", "random") else "forced"
        for level in C.DENSE.values():
            for metric, triple in zip(("spearman", "over_log_only", "over_random"), values, strict=False):
                for end, value in zip(("", "_low", "_high"), triple, strict=True):
                    out.append({"arm": "planted", "seed": None, "draw": None, "estimator": est, "target": target,
                                "level": level, "stratum": "all", "metric": f"{metric}{end}", "value": value,
                                "n": 2560, "removal_percent": None})  # fmt: skip
    for level in C.DENSE:
        for pct in (5, 50):
            for metric, value in (("lds", 0.9), ("lds_low", exact_lds_low), ("lds_high", 0.95)):
                out.append({"arm": "planted", "seed": None, "draw": None, "estimator": "influence", "target": "none",
                            "level": f"{level}_subset_pooled", "stratum": "all", "metric": metric, "value": value,
                            "n": 3, "removal_percent": pct})  # fmt: skip
    return pl.DataFrame(out, schema_overrides={"seed": pl.Int64, "draw": pl.Int64, "removal_percent": pl.Int64})


def _beats_log_only(level):
    """Judged on the dense endpoint (agreement with I over every rollout or group), never on the label's metrics:
    a method well above the strongest log-only control and random passes, one below it fails, and where I's own
    LDS, pooled over seeds, does not clear the threshold the item cannot judge (inconclusive, not n/a)."""
    rows = {
        "faithful": ((0.7, 0.67, 0.73), (0.25, 0.2, 0.3), (0.7, 0.65, 0.75)),
        "negative": ((0.2, 0.17, 0.23), (-0.25, -0.3, -0.2), (0.2, 0.15, 0.25)),
    }
    table = _dense(rows)
    got = C.beats_log_only(table, "faithful", ["reward"], CFG, level=level)
    assert got.verdict == C.PASS and got.numbers["tests"] == 2, got
    assert C.beats_log_only(table, "negative", ["reward"], CFG, level=level).verdict == C.FAIL
    assert C.beats_log_only(table, "reward", ["reward"], CFG, level=level).verdict == C.NA
    got = C.beats_log_only(_dense(rows, exact_lds_low=0.3), "negative", ["reward"], CFG, level=level)
    assert got.verdict == C.INCONCLUSIVE and "not judged: I's LDS" in got.detail


def test_beats_log_only_rollout():
    _beats_log_only("rollout")


def test_beats_log_only_group():
    _beats_log_only("group")


def test_a_pass_that_a_log_only_control_also_earns_is_counted_apart():
    """Of two method passes, the one on an item that the reward look-up passes too is not a pass of the headline."""
    passed, failed = C.Verdict(C.PASS, "x"), C.Verdict(C.FAIL, "x")
    rows = {
        "method": {item: passed for item in C.ITEMS},
        "reward": {item: passed if item == "beats_norm_step" else failed for item in C.ITEMS},
    }
    run = {item: passed for item in C.RUN_ITEMS}
    roles, positive = {"method": C.METHOD, "reward": C.CONTROL}, dict.fromkeys(C.ITEMS, "method")
    result = C.Result(run, rows, roles, V.PER_CELL, positive, log_only=["reward"])
    tally = C.counts(result)
    assert tally[C.PASS] == len(C.ITEMS) - 1 and tally[C.LOG_TOO] == 1
    page = C.to_markdown(result, CFG, "t")
    assert f"{len(C.ITEMS) - 1} pass, 1 pass that a log-only control passes too" in page
    assert "| method | method | pass, log too |" in page


def _resid(est, value, low, high):
    return [
        _row(est, "in_context", "rollout", "within_group_auc_fluency_resid", value, low, high, s, d)
        for s in SEEDS
        for d in DRAWS
    ]


def test_survives_fluency_residualization():
    metrics = pl.DataFrame(_resid("faithful", 0.7, 0.66, 0.74) + _resid("negative", 0.3, 0.26, 0.34))
    assert C.survives_residualization(metrics, "faithful", "in_context", "all").verdict == C.PASS
    assert C.survives_residualization(metrics, "negative", "in_context", "all").verdict == C.FAIL


def test_a_verdicts_detail_names_tied_cells_and_controls_the_same_way_in_any_row_order():
    """Controls tied at the top and cells tied at the bottom (a log-only control at 1.000 in every cell): the
    detail names the first seed and draw and the first control by name, whatever order the rows arrive in (two
    runs of one config wrote different names before)."""
    rows = _resid("faithful", 0.7, 0.66, 0.74) + _resid("reward", 1.0, 1.0, 1.0) + _resid("behavior", 1.0, 1.0, 1.0)
    details = set()
    for order in range(6):
        shuffled = pl.DataFrame(rows).sample(fraction=1.0, shuffle=True, seed=order)
        for est in ("faithful", "reward"):
            verdict = C.survives_residualization(shuffled, est, "in_context", "all", controls=["reward", "behavior"])
            details.add(verdict.detail)
    assert details == {
        "6/6 cells above 0.5; lowest: seed 0 draw 0 0.700 [0.660, 0.740]; strongest control: behavior at 1.000 "
        "(mean over cells)",
        "6/6 cells above 0.5; lowest: seed 0 draw 0 1.000 [1.000, 1.000]; strongest control: behavior at 1.000 "
        "(mean over cells)",
    }


def _stability(est, corr, low, high):
    return [
        {"seed": s, "estimator": est, "target": "in_context", "draws": 2, "rank_correlation_min": corr,
         "rank_correlation_min_ci_low": low, "rank_correlation_min_ci_high": high}
        for s in SEEDS
    ]  # fmt: skip


def test_stable_across_draws():
    stability = pl.DataFrame(_stability("faithful", 0.95, 0.93, 0.97) + _stability("negative", 0.2, 0.1, 0.3))
    metrics = pl.DataFrame(_resid("faithful", 0.7, 0.69, 0.71) + _resid("negative", 0.7, 0.69, 0.71))
    args = ("in_context", "all", CFG.min_draw_rank_correlation, CFG.max_draw_spread)
    assert C.stable_across_draws(stability, metrics, "faithful", *args).verdict == C.PASS
    assert C.stable_across_draws(stability, metrics, "negative", *args).verdict == C.FAIL


def test_stable_across_seeds():
    faithful = _resid("faithful", 0.7, 0.69, 0.71)
    negative = [
        _row("negative", "in_context", "rollout", "within_group_auc_fluency_resid", v, v - 0.01, v + 0.01, s, d)
        for s, v in zip(SEEDS, (0.3, 0.5, 0.8), strict=True)
        for d in DRAWS
    ]
    metrics = pl.DataFrame(faithful + negative)
    assert C.stable_across_seeds(metrics, "faithful", "in_context", "all", CFG.max_seed_sd).verdict == C.PASS
    assert C.stable_across_seeds(metrics, "negative", "in_context", "all", CFG.max_seed_sd).verdict == C.FAIL


def _placebo(est, auc, low, high, p):
    stratum = CFG.placebo_stratum
    return [
        row
        for s in SEEDS
        for d in DRAWS
        for row in (
            _row(est, "in_context", "rollout", "behavior_matched_auc", auc, low, high, s, d, "placebo", stratum),
            _row(est, "in_context", "rollout", "behavior_matched_auc_p", p, p, p, s, d, "placebo", stratum),
        )
    ]


def test_placebo_no_enrichment():
    """Pass needs evidence of chance (an AUC interval within the margin), not only the absence of a rejection."""
    metrics = pl.DataFrame(
        _placebo("faithful", 0.5, 0.45, 0.55, 0.5) + _placebo("negative", 0.8, 0.75, 0.85, 1e-9)
        + _placebo("powerless", 0.5, 0.2, 0.8, 0.5)
    )  # fmt: skip
    args = ("in_context", CFG.placebo_stratum, CFG.max_placebo_auc_gap)
    assert C.placebo_no_enrichment(metrics, "faithful", *args).verdict == C.PASS
    assert C.placebo_no_enrichment(metrics, "negative", *args).verdict == C.FAIL
    assert C.placebo_no_enrichment(metrics, "powerless", *args).verdict == C.INCONCLUSIVE


def _replay(changes: dict, reps: int):
    rng = np.random.default_rng(1)
    rows = []
    for name, change in changes.items():
        rows.append({"seed": 0, "removal": name, "matched_to": None, "removal_percent": 100, "change": change,
                     "change_low": change, "change_high": change, "reps": 1})  # fmt: skip
        random = -0.2 + rng.normal(0, 0.02, reps)
        spread = {"change": random.mean(), "change_low": random.min(), "change_high": random.max(), "reps": reps}
        rows.append({"seed": 0, "removal": "random", "matched_to": name, "removal_percent": 100, **spread})
    return pl.DataFrame(rows, schema_overrides={"matched_to": pl.String})


def test_replay_beats_random():
    """FAIL needs the set above every random set where that is rare enough: 40 random sets reach 1/41 in one
    cell; three random sets never do in one cell (1/4), but do in six cells together (1/4^6 = 2.4e-4, within the
    share of alpha of six tests in a family of 500)."""
    s = _replay({"faithful": -0.6, "negative": 0.1}, reps=40)
    assert C.replay_beats_random(s, "faithful").verdict == C.PASS
    assert C.replay_beats_random(s, "negative").verdict == C.FAIL
    few = _replay({"negative": 0.1}, reps=3)  # 1/4 is never rare enough: no evidence either way
    assert C.replay_beats_random(few, "negative").verdict == C.INCONCLUSIVE
    six = pl.concat(
        [_replay({"negative": 0.1}, reps=3).with_columns(seed=pl.lit(seed), removal_percent=pl.lit(pct))
         for seed in SEEDS for pct in (50, 100)]
    )  # fmt: skip
    family = V.Family(0.05, 500)
    got = C.replay_beats_random(six, "negative", family)
    assert got.verdict == C.FAIL and "2.4e-04" in got.detail, got.detail
    assert C.replay_beats_random(six.filter(pl.col("seed") == 0), "negative", family).verdict == C.INCONCLUSIVE


def test_tracks_effect():
    rows = [
        _row(est, "forced", "effect", CFG.effect_metric, v, v - 0.1, v + 0.1, s, d)
        for est, v in (("faithful", 0.8), ("negative", -0.2))
        for s in SEEDS
        for d in DRAWS
    ]
    metrics = pl.DataFrame(rows)
    assert C.tracks_effect(metrics, "faithful", CFG).verdict == C.PASS
    assert C.tracks_effect(metrics, "negative", CFG).verdict == C.FAIL


def test_tracks_step_removal():
    """Judged on the pooled leave-one-step-out endpoint: well above the strongest log-only control and random
    passes, below it fails, an interval across 0 is inconclusive; a log-only control is not judged."""
    rows = []
    for est, (value, margin) in {"faithful": (0.8, 0.4), "negative": (-0.3, -0.7), "powerless": (0.3, 0.05)}.items():
        width = 0.1 if est != "powerless" else 0.3
        for metric, v in (("spearman", value), ("over_log_only", margin), ("over_random", value)):
            for end, x in (("", v), ("_low", v - width), ("_high", v + width)):
                rows.append({"arm": "planted", "seed": None, "draw": None, "estimator": est, "target": "forced",
                             "level": C.STEP_OUT_POOLED, "stratum": "all", "metric": f"{metric}{end}",
                             "value": x, "n": 30, "removal_percent": None})  # fmt: skip
    table = pl.DataFrame(rows, schema_overrides={"seed": pl.Int64, "draw": pl.Int64, "removal_percent": pl.Int64})
    assert C.tracks_step_removal(table, "faithful", ["reward"], CFG).verdict == C.PASS
    assert C.tracks_step_removal(table, "negative", ["reward"], CFG).verdict == C.FAIL
    assert C.tracks_step_removal(table, "powerless", ["reward"], CFG).verdict == C.INCONCLUSIVE
    assert C.tracks_step_removal(table, "reward", ["reward"], CFG).verdict == C.NA


def _lds(level, rows_by_estimator: dict):
    """Influence-table rows of one level: per estimator (lds, low, high, margin, margin low, margin high)."""
    out = []
    for est, values in rows_by_estimator.items():
        for seed in SEEDS:
            for pct in (5, 50):
                names = ("lds", "lds_low", "lds_high", "lds_over_log_only", "lds_over_log_only_low",
                         "lds_over_log_only_high")  # fmt: skip
                for metric, value in zip(names, values, strict=False):
                    out.append({"arm": "planted", "seed": seed, "draw": None if est in ("influence", "reward") else 0,
                                "estimator": est, "target": "none" if est in ("influence", "reward") else "forced",
                                "level": f"{level}_subset", "stratum": "all", "metric": metric, "value": value,
                                "n": 30, "removal_percent": pct})  # fmt: skip
    return pl.DataFrame(out, schema_overrides={"draw": pl.Int64})


@pytest.mark.parametrize("item", C.LDS_ITEMS)
def test_lds_items(item):
    """The exact influence is the positive control; where it does not pass, no method is judged."""
    level = item.removeprefix("lds_")
    table = _lds(
        level,
        {
            "influence": (0.9, 0.85, 0.95, 0.3, 0.2, 0.4),
            "faithful": (0.8, 0.7, 0.9, 0.2, 0.1, 0.3),
            "negative": (0.0, -0.1, 0.1, -0.6, -0.7, -0.5),
            "reward": (0.6, 0.5, 0.7),
        },
    )
    assert C.lds_item(table, "influence", level, ["reward"], CFG).verdict == C.PASS
    assert C.lds_item(table, "faithful", level, ["reward"], CFG).verdict == C.PASS
    assert C.lds_item(table, "negative", level, ["reward"], CFG).verdict == C.FAIL
    # The gate is I's threshold alone: its margin over the log-only controls is no property of the cell.
    behind = table.with_columns(
        value=pl.when((pl.col("estimator") == "influence") & (pl.col("metric") == "lds_over_log_only_low"))
        .then(-0.1)
        .otherwise(pl.col("value"))
    )
    assert C.lds_item(behind, "faithful", level, ["reward"], CFG).verdict == C.PASS
    shut = table.with_columns(
        value=pl.when((pl.col("estimator") == "influence") & (pl.col("metric") == "lds_low"))
        .then(0.3)
        .otherwise(pl.col("value"))
    )
    got = C.lds_item(shut, "faithful", level, ["reward"], CFG)
    assert got.verdict == C.INCONCLUSIVE and "does not reach the threshold" in got.detail  # cells exist: never n/a
    got = C.lds_item(table, "faithful", level, ["reward"], CFG)
    assert got.numbers["tests"] == 2 * got.numbers["cells"]  # the threshold and the margin: two tests per cell


def test_an_unpowered_datamodel_is_no_row():
    """At 30 subsets of thousands of rollouts even an additive truth keeps the datamodel far below the bar; at 60
    subsets of 36 rollouts (the tests' small run) it clears it."""
    import numpy as np

    from behaviortrace.influence.datamodel import expected_lds

    rng = np.random.default_rng(0)
    rows = []
    for units, share, subsets in ((2560, 0.05, 30), (36, 0.25, 60)):
        membership = np.zeros((subsets, units))
        for j in range(subsets):
            membership[j, rng.choice(units, int(share * units), replace=False)] = 1
        rows.append({"estimator": "datamodel", "metric": "expected_lds", "value": expected_lds(membership, 10, 0)})
    many, few = rows
    assert many["value"] < 0.2 < 0.8 < few["value"]
    assert "datamodel is no row" in C.datamodel_unpowered(pl.DataFrame([many]), CFG.min_lds)
    assert C.datamodel_unpowered(pl.DataFrame([many, few]), CFG.min_lds) is None


def test_every_method_item_has_a_test_here():
    names = {name for name in globals() if name.startswith("test_")}
    for item in C.ITEMS:
        test = C.POSITIVE_CONTROL_TESTS[item].split("::")[1]
        assert test in names or (item in C.LDS_ITEMS and "test_lds_items" in names), item


def test_the_family_counts_tests_not_cells():
    """A cell compared with two controls holds two tests of FAIL's family."""
    cells = Cells().add("faithful", "in_context", "rollout", "within_group_auc", 0.9)
    cells.add("reward", "none", "rollout", "within_group_auc", 0.75).add(
        "advantage", "none", "rollout", "within_group_auc", 0.7
    )
    got = _beats(cells, "faithful", ["reward", "advantage"], [("rollout", "within_group_auc", "all")])
    assert got.numbers["cells"] == len(SEEDS) * len(DRAWS) and got.numbers["tests"] == 2 * got.numbers["cells"]


def test_fail_is_controlled_over_the_family():
    """One cell a little below the bar fails at 95% per cell, but not at the family-wise level of 500 cells."""
    value, low, high = 0.45, 0.41, 0.49
    assert V.at_least(value, low, high, 0.5, V.Z95) == (False, True)
    assert V.at_least(value, low, high, 0.5, V.Family(0.05, 500).z) == (False, False)
