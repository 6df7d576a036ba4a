"""The aggregate stage on a real workflow run: tables, the checklist recomputed by hand, figures, and the
Snakemake HTML report rendered in headless Chromium."""

import itertools
import json
import math
import re
import shutil
import statistics
import subprocess
from collections import Counter

import numpy as np
import polars as pl
import pytest
from PIL import Image

from behaviortrace.common.markdown import markdown_to_html
from behaviortrace.report import checklist as checklist_module
from behaviortrace.report import tables
from behaviortrace.score import contract
from conftest import snakemake, typed
from tolerance import UPDATE_TOLERANCE, within


@pytest.fixture(scope="module")
def out(finished_run):
    workdir, _ = finished_run
    return workdir / "results" / "wf"


@pytest.fixture(scope="module")
def metrics(out):
    return pl.read_parquet(out / "tables" / "metrics.parquet")


@pytest.fixture(scope="module")
def checklist(out):
    return json.loads((out / "checklist.json").read_text())


def test_metrics_table_is_the_union_of_every_seed_and_draw(finished_run, out, metrics):
    _, cfg = finished_run
    parts = []
    for arm, seeds in (("planted", cfg["seeds"]), ("placebo", cfg["placebo"]["seeds"])):
        for seed in seeds:
            for draw in range(cfg["targets"]["draws"]):
                parts.append(
                    pl.read_parquet(out / f"{arm}{seed}" / "metrics" / f"draw{draw}.parquet").with_columns(
                        arm=pl.lit(arm)
                    )
                )
    union = pl.concat(parts).select(metrics.columns)
    keys = ["arm", "seed", "draw", "estimator", "target", "level", "stratum", "metric"]
    assert metrics.height == union.height
    assert metrics.sort(keys).equals(union.sort(keys))
    csv = pl.read_csv(out / "tables" / "metrics.csv")
    assert csv.height == metrics.height and csv.columns == metrics.columns


def test_summary_holds_each_seed_and_the_mean_and_sd(finished_run, out, metrics):
    _, cfg = finished_run
    text = (out / "tables" / "summary.md").read_text()
    # Recompute one line by hand: gas, in-context target, rollout-level AUROC, stratum all.
    rows = [
        r
        for r in metrics.iter_rows(named=True)
        if r["arm"] == "planted"
        and r["estimator"] == "gas"
        and r["target"] == "in_context"
        and r["level"] == "rollout"
        and r["metric"] == "auroc"
        and r["stratum"] == "all"
    ]
    per_seed = [statistics.mean(r["value"] for r in rows if r["seed"] == s) for s in cfg["seeds"]]
    expected = (
        f"| gas | in_context | rollout | {per_seed[0]:.3f} | {per_seed[1]:.3f} | "
        f"{statistics.mean(per_seed):.3f} ± {statistics.stdev(per_seed):.3f} |"
    )
    section = text[text.index("## AUROC — stratum `all`") :]
    assert expected in section.split("##")[1]
    for heading in ("Lift", "Within-group AUC, raw", "Within-group AUC, fluency-residualized"):
        assert f"## {heading}" in text


def _brute_spearman(a, b):
    def ranks(x):
        r = np.empty(len(x))
        for i, v in enumerate(x):
            r[i] = (x < v).sum() + ((x == v).sum() + 1) / 2
        return r

    ra, rb = ranks(a), ranks(b)
    return float(
        ((ra - ra.mean()) * (rb - rb.mean())).sum()
        / np.sqrt(((ra - ra.mean()) ** 2).sum() * ((rb - rb.mean()) ** 2).sum())
    )


def test_draw_stability_rank_correlation_matches_brute_force(out):
    table = pl.read_parquet(out / "tables" / "draw_stability.parquet")
    row = table.filter((pl.col("seed") == 0) & (pl.col("estimator") == "gas") & (pl.col("target") == "in_context"))
    scores = [
        pl.read_parquet(out / "planted0" / "scores" / "gas" / f"draw{d}_in_context.parquet").sort("rollout_id")
        for d in (0, 1)
    ]
    a, b = scores[0]["score"].to_numpy(), scores[1]["score"].to_numpy()
    assert row["rank_correlation_min"][0] == pytest.approx(_brute_spearman(a, b), abs=1e-9)
    # Target-free controls do not depend on the draw.
    norm = table.filter(pl.col("estimator") == "norm")
    assert norm["rank_correlation_min"].to_list() == pytest.approx([1.0] * norm.height, abs=1e-12)
    seeds = pl.read_parquet(out / "tables" / "seed_stability.parquet")
    assert set(seeds.columns) >= {"estimator", "beats_norm_step", "beats_norm_rollout", "beats_fluency_rollout"}


# Three verdicts recomputed from metrics.parquet alone, with plain loops over its rows.


def _rows(metrics, **where):
    return [r for r in metrics.iter_rows(named=True) if all(r[k] == v for k, v in where.items())]


def _widened_high(value, high, checklist):
    """The upper end of a 95% interval widened to the checklist's family-wise level (report/verdicts.py)."""
    return value + (high - value) * checklist["family"]["z"] / 1.959963984540054


def _replicates(out, row):
    """A metric row's bootstrap replicates, read from the evaluate job's own file of its seed and draw."""
    table = pl.read_parquet(out / f"{row['arm']}{row['seed']}" / "metrics" / f"draw{row['draw']}.parquet")
    keys = ("estimator", "target", "level", "stratum", "metric")
    (hit,) = [r for r in table.iter_rows(named=True) if all(r[k] == row[k] for k in keys)]
    return np.asarray(hit["replicates"], float)


def _paired_cell(out, own, control, checklist, fold=False):
    """(passes, fails) of one cell against one control: the percentile interval of own - control over their shared
    resamples above 0; its widened interval below 0. `fold`: the control's AUC taken both ways."""
    a, b = _replicates(out, own), _replicates(out, control)
    value = control["value"]
    if fold and value < 0.5:
        b, value = 1 - b, 1 - value
    diff = a - b
    low, high = np.percentile(diff[np.isfinite(diff)], [2.5, 97.5])
    point = own["value"] - value
    return low > 0, _widened_high(point, high, checklist) < 0


def test_random_at_chance_verdict_recomputed(finished_run, metrics, checklist):
    """Holm over the random control's three p-values of every seed and draw (rollout lift, AUROC, step lift)."""
    p_values = [
        r["value"]
        for r in _rows(metrics, arm="planted", estimator="random", stratum="all")
        if (r["level"], r["metric"]) in (("rollout", "lift_p"), ("rollout", "auroc_p"), ("step", "lift_p"))
    ]
    assert len(p_values) == 12
    alpha = finished_run[1]["checklist"]["alpha"]
    # Holm rejects something exactly when the smallest p-value is at most alpha / m.
    expected = "pass" if min(p_values) > alpha / len(p_values) else "fail"
    assert checklist["run"]["random_at_chance"]["verdict"] == expected


@pytest.mark.parametrize("estimator", ["gas", "trak", "norm", "random"])
def test_residualization_verdict_recomputed(metrics, checklist, estimator):
    target = "none" if estimator in ("norm", "random") else "in_context"
    rows = _rows(
        metrics,
        arm="planted",
        estimator=estimator,
        target=target,
        level="rollout",
        stratum="all",
        metric="within_group_auc_fluency_resid",
    )
    assert rows
    expected = (
        "fail"
        if any(_widened_high(r["value"], r["ci_high"], checklist) < 0.5 for r in rows)
        else "pass"
        if all(r["ci_low"] > 0.5 for r in rows)
        else "inconclusive"
    )
    assert checklist["estimators"][estimator]["survives_fluency_residualization"]["verdict"] == expected


@pytest.mark.parametrize("estimator", ["gas", "tracincp", "random", "fluency"])
def test_beats_norm_at_rollout_level_verdict_recomputed(out, metrics, checklist, estimator):
    """The paired difference with the norm on the shared bootstrap resamples, from the evaluate job's replicates."""
    target = "none" if estimator in ("fluency", "random") else "in_context"
    beaten, below = [], []
    for r in _rows(
        metrics,
        arm="planted",
        estimator=estimator,
        target=target,
        level="rollout",
        stratum="all",
        metric="within_group_auc",
    ):
        norm = _rows(
            metrics,
            arm="planted",
            estimator="norm",
            level="rollout",
            stratum="all",
            metric="within_group_auc",
            seed=r["seed"],
            draw=r["draw"],
        )[0]
        passes, fails = _paired_cell(out, r, norm, checklist)
        beaten.append(passes)
        below.append(fails)
    assert beaten
    expected = "fail" if any(below) else "pass" if all(beaten) else "inconclusive"
    assert checklist["estimators"][estimator]["beats_norm_rollout"]["verdict"] == expected
    assert checklist["estimators"]["norm"]["beats_norm_rollout"]["verdict"] == "n/a"


@pytest.mark.parametrize("estimator", ["gas", "norm"])
def test_beats_fluency_verdict_recomputed_with_fluency_taken_both_ways(
    finished_run, out, metrics, checklist, estimator
):
    """Fluency's AUROC v counts as max(v, 1 - v): its interval is folded at 0.5 before the comparison. The
    controls page shows, per stratum, on how many cells the estimator lies wholly above it."""
    _, cfg = finished_run
    limits = cfg["checklist"]
    target = "none" if estimator == "norm" else limits["target_kind"]
    page = (out / "tables" / "controls.md").read_text()
    beaten, below = [], []
    for stratum in limits["fluency_strata"]:
        wins, cells = 0, 0
        for r in _rows(
            metrics,
            arm="planted",
            estimator=estimator,
            target=target,
            level="rollout",
            stratum=stratum,
            metric=limits["fluency_metric"],
        ):
            (f,) = _rows(
                metrics,
                arm="planted",
                estimator="fluency",
                level="rollout",
                stratum=stratum,
                metric=limits["fluency_metric"],
                seed=r["seed"],
                draw=r["draw"],
            )
            high = max(f["ci_high"], 1 - f["ci_low"])
            passes, fails = _paired_cell(out, r, f, checklist, fold=True)
            beaten.append(passes)
            below.append(fails)
            wins, cells = wins + (r["ci_low"] > high), cells + 1  # the controls page: intervals side by side
        section = page[page.index(f"### Stratum `{stratum}`") :].split("\n### ")[0]
        if not cells:  # no checkpoint of the small run saturates
            assert "No rollouts in this stratum." in section
            continue
        row = next(line for line in section.splitlines() if line.startswith(f"| {estimator} |"))
        assert row.rstrip(" |").endswith(f" {wins}/{cells}"), (stratum, row)
    assert beaten
    expected = "fail" if any(below) else "pass" if all(beaten) else "inconclusive"
    assert checklist["estimators"][estimator]["beats_fluency"]["verdict"] == expected


def test_both_ways_folds_an_auc_interval_at_chance():
    rows = pl.DataFrame(
        {
            "estimator": ["fluency"] * 3 + ["gas"],
            "metric": ["auroc"] * 4,
            "value": [0.3, 0.55, 0.8, 0.3],
            "ci_low": [0.2, 0.4, 0.7, 0.2],
            "ci_high": [0.4, 0.7, 0.9, 0.4],
        }
    )
    folded = tables.both_ways(rows, "fluency", "auroc")
    assert folded["value"].to_list() == pytest.approx([0.7, 0.55, 0.8, 0.3])
    assert folded["ci_low"].to_list() == pytest.approx([0.6, 0.5, 0.7, 0.2])
    assert folded["ci_high"].to_list() == pytest.approx([0.8, 0.7, 0.9, 0.4])


def test_checklist_lists_every_item_threshold_and_estimator(finished_run, out, checklist):
    _, cfg = finished_run
    assert checklist["thresholds"] == cfg["checklist"]
    references = {"influence", "earlier"} | ({"datamodel"} if "datamodel" in checklist["roles"] else set())
    assert set(checklist["estimators"]) == set(cfg["estimators"]) | references
    instances = contract.instances(cfg["estimators"])
    for name, role in checklist["roles"].items():
        expected = "reference" if name in references else "method" if instances[name].uses_target else "control"
        assert role == expected, name
    for row in checklist["estimators"].values():
        assert set(row) == set(checklist["items"])
        assert all(v["verdict"] in ("pass", "fail", "inconclusive", "n/a") and v["detail"] for v in row.values())
    assert set(checklist["run"]) == set(checklist["run_items"])
    # The counts are the methods' verdicts on the method items, nothing else; a pass on an item that a log-only
    # control passes too is counted apart.
    methods = [n for n, role in checklist["roles"].items() if role == "method"]
    log_only = [n for n, inst in instances.items() if inst.log_only]
    shared = {
        i for i in checklist["items"] if any(checklist["estimators"][c][i]["verdict"] == "pass" for c in log_only)
    }
    tally = Counter(
        "pass_log_only_too" if v["verdict"] == "pass" and item in shared else v["verdict"]
        for n in methods
        for item, v in checklist["estimators"][n].items()
    )
    assert checklist["counts"] == {k: tally[k] for k in ("pass", "pass_log_only_too", "fail", "inconclusive", "n/a")}
    assert sum(checklist["counts"].values()) == len(methods) * len(checklist["items"])
    text = (out / "checklist.md").read_text()
    for key, value in cfg["checklist"].items():
        assert f"- `{key}`: {value}" in text
    for est in cfg["estimators"]:
        assert f"| {est} |" in text
    assert text.index("## Can this run judge methods?") < text.index("## Methods (")


def test_sketch_coverage_verdict_reads_every_captured_step(finished_run, out, checklist):
    """The small run captures at train time: every step of every store is checked against TRL's gradient,
    and the verdict reports the worst error over all of them, recomputed here from the stores."""
    from behaviortrace.report.checklist import FAIL, PASS, sketch_covers
    from behaviortrace.sketch.store import read_steps, shard_checks

    _, cfg = finished_run
    stores = sorted(out.glob("planted*/sketch/shard*.zarr"))  # the planted seeds, as the checklist reads them
    shards = shard_checks(stores)
    errors = np.concatenate([read_steps([p])["self_check_error"].to_numpy() for p in stores])
    assert {s["mode"] for s in shards} == {"train"} and np.isfinite(errors).all()
    item = checklist["run"]["sketch_covers_parameters"]  # a run item, judged once
    assert item["verdict"] == "pass"
    assert item["numbers"]["max_self_check_error"] == pytest.approx(errors.max())
    assert item["numbers"]["checked_steps"] == item["numbers"]["steps"] == len(errors)
    # A captured store with a step left unchecked fails the item, even with a small error elsewhere.
    skipped = [dict(shards[0], checked_steps=shards[0]["steps"] - 1)] + shards[1:]
    assert sketch_covers(skipped, 1e-4).verdict == FAIL
    assert sketch_covers(shards, 1e-4).verdict == PASS
    assert sketch_covers(shards, errors.max() / 2).verdict == FAIL


def test_replay_table_covers_every_seed_and_removal(finished_run, out):
    _, cfg = finished_run
    table = pl.read_parquet(out / "tables" / "replay.parquet")
    rp = cfg["replay"]
    # full, then per percent the label set and every estimator, each with its step-matched random repetitions
    per_seed = 1 + len(rp["removal_percent"]) * (1 + len(rp["estimators"])) * (1 + rp["random_repeats"])
    keys = ["seed", "removal", "matched_to", "removal_percent", "rep"]
    assert table.select(keys).unique().height == len(cfg["seeds"]) * per_seed
    # each measured checkpoint (window end, last step) for probes and controls
    assert table.height == len(cfg["seeds"]) * per_seed * len(rp["measure_at"]) * 2
    full = table.filter(pl.col("removal") == "full")
    assert (full["n_removed"] == 0).all() and (full["change"] == 0).all()
    assert within(full["update_error"].max(), UPDATE_TOLERANCE)  # reproduces the checkpoints (tolerance.py)
    for seed in cfg["seeds"]:
        rollouts = pl.read_parquet(out / f"planted{seed}" / "rollouts.parquet")
        label_set = table.filter((pl.col("seed") == seed) & (pl.col("removal") == "label"))
        assert (label_set["n_removed_paid"] == int(rollouts["paid"].sum())).all()
        removed = set(label_set["removed_ids"][0].to_list())
        assert removed == set(rollouts.filter(pl.col("paid"))["rollout_id"].to_list())
        gas = table.filter((pl.col("seed") == seed) & (pl.col("removal") == "gas"))["removed_ids"][0].to_list()
        # the top-scored set among the rollouts of the steps before the replay's last measured checkpoint
        end = table["step"].max()
        scores = pl.read_parquet(out / f"planted{seed}" / "scores" / "gas" / "draw0_in_context.parquet")
        scores = scores.join(rollouts.select("rollout_id", "step"), on="rollout_id")
        assert scores.filter(pl.col("rollout_id").is_in(gas))["step"].max() < end
        cutoff = scores.filter(pl.col("rollout_id").is_in(gas))["score"].min()
        assert (scores.filter(~pl.col("rollout_id").is_in(gas) & (pl.col("step") < end))["score"] <= cutoff).all()
        # every random comparison takes as many rollouts from each step as the set it is matched to
        steps = dict(zip(rollouts["rollout_id"].to_list(), rollouts["step"].to_list(), strict=True))
        for name, ids in (("gas", gas), ("label", list(removed))):
            matched = table.filter((pl.col("seed") == seed) & (pl.col("matched_to") == name))
            assert matched["rep"].n_unique() == rp["random_repeats"]
            per_step = Counter(steps[i] for i in ids)
            for other in matched.unique("rep")["removed_ids"].to_list():
                assert Counter(steps[i] for i in other) == per_step


def _window_end_probe_rows(out) -> list[dict]:
    return [
        r
        for r in pl.read_parquet(out / "tables" / "replay.parquet").iter_rows(named=True)
        if r["checkpoint"] == "window_end" and r["prompt_set"] == "probes"
    ]


def test_replay_has_power_verdict_recomputed(finished_run, out, checklist):
    _, cfg = finished_run
    rows = _window_end_probe_rows(out)
    full = {r["seed"]: r["behavior_rate"] for r in rows if r["removal"] == "full"}
    ok, failed = [], []
    for seed in cfg["seeds"]:
        for pct in cfg["replay"]["removal_percent"]:
            label_set = [
                r["behavior_rate"] - full[seed]
                for r in rows
                if (r["seed"], r["removal"], r["removal_percent"]) == (seed, "label", pct)
            ]
            random = [
                r["behavior_rate"] - full[seed]
                for r in rows
                if (r["seed"], r["matched_to"], r["removal_percent"]) == (seed, "label", pct)
            ]
            assert len(label_set) == 1 and len(random) == cfg["replay"]["random_repeats"]
            short = label_set[0] > -cfg["checklist"]["min_label_drop"]
            ok.append(not short and label_set[0] < min(random))
            failed.append(short or label_set[0] >= sum(random) / len(random))
    assert checklist["run"]["replay_has_power"]["verdict"] == _three_valued(ok, failed)


def _three_valued(ok: list[bool], failed: list[bool]) -> str:
    return "fail" if any(failed) else "pass" if all(ok) else "inconclusive"


def test_replay_beats_random_verdict_recomputed(finished_run, out, checklist):
    _, cfg = finished_run
    rows = _window_end_probe_rows(out)
    beaten, above = [], []
    for seed in cfg["seeds"]:
        for pct in cfg["replay"]["removal_percent"]:
            cell = [
                (r["removal"], r["matched_to"], r["change"])
                for r in rows
                if (r["seed"], r["removal_percent"]) == (seed, pct)
            ]
            gas = [change for removal, matched, change in cell if removal == "gas"]
            random = [change for removal, matched, change in cell if matched == "gas"]
            assert len(gas) == 1 and len(random) == cfg["replay"]["random_repeats"]
            beaten.append(gas[0] < min(random))
            above.append((gas[0] > max(random), 1 / (len(random) + 1)))
    # FAIL: above every random set in every cell, where the product of 1 / (R + 1) is within the cells' share of alpha.
    share = cfg["checklist"]["alpha"] * len(above) / checklist["family"]["method_tests"]
    failed = [all(a for a, _ in above) and math.prod(p for _, p in above) <= share]
    verdicts = {est: row["replay_beats_random"]["verdict"] for est, row in checklist["estimators"].items()}
    assert verdicts["gas"] == _three_valued(beaten, failed)
    assert verdicts["random"] == "n/a"  # its top-scored set are a random removal: the baseline itself
    assert verdicts["trak"] == "n/a"  # not under replay.estimators in the small config


@pytest.mark.parametrize("estimator,target,stratum", [("tracincp", "forced", "all"), ("norm", "none", "window")])
def test_effect_metrics_recomputed_from_the_step_log_and_the_step_scores(
    out, metrics, finished_run, estimator, target, stratum
):
    _, cfg = finished_run
    steps = pl.read_parquet(out / "planted0" / "steps.parquet").sort("step")
    scores = pl.read_parquet(out / "planted0" / "scores" / estimator / f"draw0_{target}_steps.parquet").sort("step")
    first, last = cfg["planting"]["window"] if stratum == "window" else (0, cfg["grpo"]["steps"] - 1)
    keep = [first <= t <= last for t in steps["step"].to_list()]
    change = steps["target_change"].to_numpy()[keep]
    score = scores["score"].to_numpy()[keep]
    rows = {
        r["metric"]: r
        for r in _rows(metrics, arm="planted", seed=0, draw=0, estimator=estimator, target=target, stratum=stratum)
        if r["level"] == "effect"
    }
    assert rows["effect_pearson"]["value"] == pytest.approx(np.corrcoef(score, change)[0, 1], abs=1e-9)
    assert rows["effect_spearman"]["value"] == pytest.approx(_brute_spearman(score, change), abs=1e-9)
    # Given the step number: the correlation of the ranks' residuals after a least-squares fit on the step's rank.
    step_ranks = pl.Series(steps["step"].to_numpy()[keep]).rank().to_numpy()
    design = np.column_stack([np.ones(len(step_ranks)), step_ranks])

    def residual(v):
        r = pl.Series(v).rank().to_numpy()
        return r - design @ np.linalg.lstsq(design, r, rcond=None)[0]

    given = np.corrcoef(residual(score), residual(change))[0, 1]
    assert rows["effect_spearman_given_step"]["value"] == pytest.approx(given, abs=1e-9)
    assert rows["effect_pearson"]["n"] == sum(keep)
    # Only estimators whose step scores predict the change in its units, against the forced target, get a share.
    if estimator == "tracincp":
        assert rows["effect_share"]["value"] == pytest.approx(score.sum() / change.sum(), rel=1e-9)
    else:
        assert "effect_share" not in rows
    rollouts = pl.read_parquet(out / "planted0" / "rollouts.parquet")
    counts = rollouts.group_by("step").agg(pl.col("paid").sum()).sort("step")["paid"].to_numpy()[keep]
    paid = _rows(metrics, arm="planted", seed=0, draw=0, estimator="label", stratum=stratum, metric="effect_spearman")
    expected = _brute_spearman(counts.astype(float), change)
    if np.isnan(expected):  # the same paid count at every step of the stratum: no correlation is defined
        assert np.ptp(counts) == 0 and np.isnan(paid[0]["value"])
    else:
        assert paid[0]["value"] == pytest.approx(expected, abs=1e-9)


def test_tracks_effect_verdict_recomputed(finished_run, metrics, checklist):
    _, cfg = finished_run
    limits = cfg["checklist"]
    for estimator, row in checklist["estimators"].items():
        cells = [
            (r["ci_low"], r["ci_high"])
            for r in _rows(metrics, arm="planted", estimator=estimator, stratum="all", level="effect")
            if r["metric"] == limits["effect_metric"] and r["target"] in (limits["effect_target_kind"], "none")
        ]
        if estimator in ("influence", "datamodel", "earlier"):  # reference rows: judged on the LDS items only
            assert not cells and row["tracks_effect"]["verdict"] == "n/a"
            continue
        assert len(cells) == len(cfg["seeds"]) * cfg["targets"]["draws"]
        limit = limits["min_effect_correlation"]
        values = [
            r["value"]
            for r in _rows(metrics, arm="planted", estimator=estimator, stratum="all", level="effect")
            if r["metric"] == limits["effect_metric"] and r["target"] in (limits["effect_target_kind"], "none")
        ]
        want = (
            "fail"
            if any(_widened_high(v, high, checklist) < limit for v, (_, high) in zip(values, cells, strict=True))
            else "pass"
            if all(low >= limit for low, _ in cells)
            else "inconclusive"
        )
        assert row["tracks_effect"]["verdict"] == want, estimator


def _spearman_by_hand(x, y):
    """Spearman from tie-averaged ranks counted pairwise (independent of the influence table's ranking)."""

    def ranks(v):
        v = np.asarray(v, float)
        return (v[None, :] < v[:, None]).sum(1) + ((v[None, :] == v[:, None]).sum(1) + 1) / 2

    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def _lds_verdict_by_hand(table, name, level, limit, log_only, target, checklist) -> str:
    """The LDS item's rule, from the influence table's rows: only the cells where the exact influence reaches the
    threshold are judged (all of them for I's own row); a cell passes where its interval (and, unless the row is
    log-only, its margin over the log-only controls) clears, fails where one widened to the family-wise level lies
    wholly on the wrong side."""
    value = {}
    for r in table.filter((pl.col("arm") == "planted") & (pl.col("level") == f"{level}_subset")).iter_rows(named=True):
        if r["target"] in (target, "none"):
            value[r["seed"], r["removal_percent"], r["estimator"], r["draw"], r["metric"]] = r["value"]
    cells = {(s, p) for s, p, *_ in value}
    open_cells = {(s, p) for s, p in cells if value[s, p, "influence", None, "lds_low"] >= limit}  # I's threshold alone
    if name != "influence" and not open_cells:
        return "inconclusive"  # the cells exist, but none can judge a method
    verdicts = []
    for (s, p, e, d, metric), low in value.items():
        judged = name == "influence" or (s, p) in open_cells
        if e != name or metric != "lds_low" or not judged or np.isnan(value[s, p, e, d, "lds"]):
            continue
        point, high = value[s, p, e, d, "lds"], value[s, p, e, d, "lds_high"]
        margin = None if name in log_only else value.get((s, p, e, d, "lds_over_log_only"))
        clears = low >= limit and (margin is None or value[s, p, e, d, "lds_over_log_only_low"] > 0)
        below = _widened_high(point, high, checklist) < limit or (
            margin is not None and _widened_high(margin, value[s, p, e, d, "lds_over_log_only_high"], checklist) < 0
        )
        verdicts.append("pass" if clears else "fail" if below else "inconclusive")
    if not verdicts:  # an undefined LDS (constant scores) in every judged cell
        return "n/a"
    return "fail" if "fail" in verdicts else "inconclusive" if "inconclusive" in verdicts else "pass"


def test_lds_values_and_verdicts_recomputed(finished_run, out, checklist):
    """Every score file's LDS at each level and subset size, recomputed by hand from the per-seed files (the
    retrained subsets, f(w_T), the scores); each LDS verdict from the table's intervals by the item's rule."""
    _, cfg = finished_run
    limits = cfg["checklist"]
    target = limits["effect_target_kind"]
    instances = contract.instances(cfg["estimators"])
    log_only = {name for name, inst in instances.items() if inst.log_only}
    # The checklist reads the LDS under the configured meaning of removal (the table holds the other one too).
    semantics = cfg["influence"]["semantics"]
    table = pl.read_parquet(out / "tables" / "influence.parquet")
    assert set(table["semantics"].drop_nulls()) == {"advantages", "held"}
    table = table.filter(pl.col("semantics").is_null() | (pl.col("semantics") == semantics))
    lds = table.filter((pl.col("arm") == "planted") & (pl.col("metric") == "lds"))
    checked = 0
    for seed in cfg["seeds"]:
        folder = out / f"planted{seed}"
        f_end = json.loads((folder / "influence" / "summary.json").read_text())["f_end"]
        retrained = pl.read_parquet(folder / "influence" / "retrain.parquet").filter(pl.col("kind") == "lds")
        assert set(retrained["semantics"]) == {"advantages", "held"}  # influence.lds_both_semantics
        retrained = retrained.filter(pl.col("semantics") == semantics)
        assert set(retrained["level"]) == {"rollout", "group"}
        assert set(retrained["removal_percent"]) == set(cfg["influence"]["lds_percents"])
        for (level, pct), part in retrained.group_by("level", "removal_percent"):
            assert part.height == cfg["influence"]["lds_subsets"]
            changes = (part["f"] - f_end).to_list()
            for name, inst in instances.items():
                kind = target if inst.uses_target else "none"
                score = dict(
                    pl.read_parquet(folder / "scores" / name / f"draw0_{kind}.parquet")
                    .select("rollout_id", "score")
                    .iter_rows()
                )
                # Sums to 12 significant digits: equal in exact arithmetic means tied (influence/lds.py).
                predicted = [float(f"{-sum(score[z] for z in ids):.12g}") for ids in part["removed_ids"]]
                row = lds.filter(
                    (pl.col("seed") == seed)
                    & (pl.col("draw") == 0)
                    & (pl.col("estimator") == name)
                    & (pl.col("target") == kind)
                    & (pl.col("level") == f"{level}_subset")
                    & (pl.col("removal_percent") == pct)
                )
                # A score constant over the rollouts before T (step_paid where every step paid) ranks no subset:
                # NaN on both sides.
                by_hand = _spearman_by_hand(predicted, changes)
                assert row["value"].to_list() == pytest.approx([by_hand], abs=1e-9, nan_ok=True)
                checked += 1
    assert checked == len(cfg["seeds"]) * 4 * len(instances)
    # The datamodel is a row where its design is powered: 36 rollouts and 9 groups against 60 subsets are.
    expected_lds = table.filter((pl.col("estimator") == "datamodel") & (pl.col("metric") == "expected_lds"))
    assert ("datamodel" in checklist["roles"]) == (expected_lds["value"].max() >= limits["min_lds"])
    for name in checklist["estimators"]:
        for item, level in (("lds_rollout", "rollout"), ("lds_group", "group")):
            expected = _lds_verdict_by_hand(table, name, level, limits["min_lds"], log_only, target, checklist)
            assert checklist["estimators"][name][item]["verdict"] == expected, (name, item)
    # Every step before T paid in this run: step_paid's rollout scores are constant, its LDS undefined, not judged.
    for item in ("lds_rollout", "lds_group"):
        verdict = checklist["estimators"]["step_paid"][item]
        assert verdict["verdict"] == "n/a", verdict


def test_positive_controls_pass_the_lds_items_and_negative_controls_fail(finished_run, out, checklist):
    """On the small run in the smooth regime: the exact influence passes both LDS items with advantages held (the
    checklist's own rule on the table's held rows); through the advantages (the configured meaning) it passes
    lds_group and its LDS interval clears the threshold in every rollout cell, where the reward look-up predicts
    the removals nearly as well (one cell's margin over it may straddle 0: inconclusive). Random, the norm,
    earlier-is-more and fluency pass neither: with 60 subsets per cell their intervals are too wide to FAIL at the
    family-wise level, which the synthetic negative controls of tests/test_checklist_items.py do."""
    _, cfg = finished_run
    assert cfg["influence"]["semantics"] == "advantages"
    items = ("lds_rollout", "lds_group")
    verdicts = {name: {row[item]["verdict"] for item in items} for name, row in checklist["estimators"].items()}
    details = [checklist["estimators"]["influence"][i]["detail"] for i in items]
    assert checklist["estimators"]["influence"]["lds_group"]["verdict"] == "pass", details
    assert checklist["estimators"]["influence"]["lds_rollout"]["verdict"] in ("pass", "inconclusive"), details
    table = pl.read_parquet(out / "tables" / "influence.parquet")
    limit = typed(cfg).checklist.min_lds
    lows = table.filter(
        (pl.col("arm") == "planted")
        & (pl.col("estimator") == "influence")
        & (pl.col("semantics") == "advantages")
        & (pl.col("metric") == "lds_low")
        & pl.col("seed").is_not_null()  # each seed's own cells, not the pooled ones
    )
    assert lows.height == 8 and (lows["value"] >= limit).all(), lows
    log_only = [name for name, inst in contract.instances(cfg["estimators"]).items() if inst.log_only]
    held = table.filter(pl.col("semantics").is_null() | (pl.col("semantics") == "held"))
    for item in items:
        verdict = checklist_module.lds_item(
            held, "influence", item.removeprefix("lds_"), log_only, typed(cfg).checklist
        )
        assert verdict.verdict == "pass", verdict.detail
    for name in ("random", "norm", "earlier", "fluency"):
        assert "pass" not in verdicts[name], [checklist["estimators"][name][i]["detail"] for i in items]
    # Each item names its positive control: the exact influence where it passes, else the synthetic test.
    for item in items:
        passed = checklist["estimators"]["influence"][item]["verdict"] == "pass"
        named = "influence" if passed else f"tests/test_checklist_items.py::test_{item}"
        assert named in checklist["positive_controls"][item].split(", ")


# Items whose evidence has an interval: pass and fail only where it clears the threshold, else inconclusive.
INTERVAL_ITEMS = (
    "beats_norm_step",
    "beats_norm_rollout",
    "beats_fluency",
    "beats_log_only_rollout",
    "beats_log_only_group",
    "survives_fluency_residualization",
    "stable_across_draws",
    "stable_across_seeds",
    "tracks_effect",
    "tracks_step_removal",
    "lds_rollout",
    "lds_group",
)


def test_another_study_contradicts_no_verdict_judged_by_intervals(checklist, second_study):
    """The same study on other training seeds (without what no item judged by intervals reads: the placebo arm and
    the estimators' replays): on every item judged by intervals, no estimator goes from pass to fail or from fail to
    pass (a cell may become inconclusive, or n/a where the other run cannot judge)."""
    other = json.loads((second_study[0] / "results" / "wf" / "checklist.json").read_text())
    compared, flips = 0, []
    for name, row in checklist["estimators"].items():
        for item in INTERVAL_ITEMS:
            pair = {row[item]["verdict"], other["estimators"][name][item]["verdict"]}
            compared += pair <= {"pass", "fail"}
            if pair == {"pass", "fail"}:
                flips.append((name, item, row[item]["detail"], other["estimators"][name][item]["detail"]))
    assert compared >= 20 and not flips, flips


def test_effect_steps_table_puts_every_step_beside_its_scores(finished_run, out):
    _, cfg = finished_run
    table = pl.read_parquet(out / "tables" / "effect_steps.parquet")
    keys = table.select("seed", "estimator", "target").unique()
    assert table.height == keys.height * cfg["grpo"]["steps"]
    assert set(keys["target"]) == {cfg["checklist"]["effect_target_kind"], "none"}
    steps = pl.read_parquet(out / "planted1" / "steps.parquet").sort("step")
    gas = table.filter((pl.col("seed") == 1) & (pl.col("estimator") == "gas")).sort("step")
    assert gas["target_change"].to_list() == steps["target_change"].to_list()
    assert gas["n_paid"].sum() == pl.read_parquet(out / "planted1" / "rollouts.parquet")["paid"].sum()


def test_figures_are_real_images(out):
    for name in (
        "behavior_rates",
        "lift",
        "within_group_auc",
        "token_alignment",
        "replay",
        "effect_tracking",
        "effect_vs_labels",
        "influence",
    ):
        image = np.asarray(Image.open(out / "figures" / f"{name}.png").convert("L"))
        assert image.shape[0] > 200 and image.shape[1] > 300
        assert image.std() > 10  # not a blank canvas
    # The influence figure reads at page width (it was 36 panels, 3,423 px wide).
    assert Image.open(out / "figures" / "influence.png").width <= 1600
    # The report's figures record their tick-label overlaps in the PNG (figures.py: label_collisions): none.
    for path in sorted((out / "figures").glob("*.png")):
        if path.stem != "influence":
            assert Image.open(path).text["Label collisions"] == "none", path.name


def test_label_collisions_finds_tick_labels_drawn_over_each_other():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from behaviortrace.report.figures import label_collisions

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_xticks([0, 1, 2], ["a long tick label", "another long one", "c"])
    assert "a long tick label / another long one" in label_collisions(fig)
    ax.set_xticks([0, 1, 2], ["a", "b", "c"])
    assert label_collisions(fig) == []
    plt.close(fig)


def test_markdown_tables_become_html_tables():
    html = markdown_to_html("# T\n\nsome `code`\n\n| a | b |\n|---|---|\n| 1 | **x** |\n\n- one\n- two\n", "t")
    assert "<h1>T</h1>" in html and "<code>code</code>" in html
    assert "<thead><tr><th>a</th><th>b</th></tr></thead>" in html and "<td><strong>x</strong></td>" in html
    assert "<ul><li>one</li><li>two</li></ul>" in html


# What `snakemake --report` prints when something is wrong: docutils' system messages ("(WARNING/2)",
# "(ERROR/3)"), Snakemake's warnings and errors, a traceback.
REPORT_PROBLEM = re.compile(
    r"\((DEBUG|INFO|WARNING|ERROR|SEVERE)/\d\)|warning|error|undefined|traceback", re.IGNORECASE
)

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=15000",
    "--window-size=1400,1000",
]


def test_report_renders_in_headless_chromium(finished_run, tmp_path):
    workdir, _ = finished_run
    report = workdir / "results" / "wf" / "report.html"
    res = snakemake(workdir, "--report", str(report))
    assert res.returncode == 0, res.stderr[-3000:]
    # Nothing to warn about: no docutils message (a caption's "(ERROR/3) Undefined substitution"), no warning.
    printed = [line for line in (res.stdout + res.stderr).splitlines() if REPORT_PROBLEM.search(line)]
    assert not printed, "\n".join(printed)
    text = report.read_text()
    assert "system-message" not in text and "Docutils System Messages" not in text
    # Self-contained: every result is embedded, captions included.
    for needle in ("checklist.html", "lift.png", "The attribution checklist", "Token-level alignment"):
        assert needle in text
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Chromium is not installed (make test installs Debian's chromium package)"
    shot = tmp_path / "report.png"
    profile = tmp_path / "profile"
    run = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}", report.as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert shot.exists(), run.stderr[-2000:]
    image = np.asarray(Image.open(shot).convert("L"))
    assert image.shape == (1000, 1400) and image.std() > 5
    dom = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", report.as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
    ).stdout
    assert "BehaviorTrace" in dom  # the report's own page rendered, not an error page
    assert "system-message" not in dom
    shutil.copy(shot, workdir / "results" / "wf" / "report_screenshot.png")


@pytest.mark.parametrize(
    "changes,verdict",
    [
        ([-0.9, -0.8], "pass"),  # below every random removal in both cells
        ([-0.9, -0.45], "inconclusive"),  # seed 1: below the random mean, above its lowest
        ([-0.9, 0.1], "inconclusive"),  # seed 1: above every random set, but with 3 of them that happens 1 in 4
    ],
)
def test_replay_beats_random_three_valued(changes, verdict):
    """Random sets matched to gas: seed 0 changes -0.1, -0.2, -0.3; seed 1 -0.2, -0.4, -0.6 (mean -0.4)."""
    randoms = {0: [-0.1, -0.2, -0.3], 1: [-0.2, -0.4, -0.6]}
    rows = [
        {"seed": seed, "removal": "gas", "matched_to": None, "removal_percent": 100, "change": change, "reps": 1}
        for seed, change in enumerate(changes)
    ]
    rows += [
        {"seed": seed, "removal": "random", "matched_to": "gas", "removal_percent": 100, "change": c, "reps": 1}
        for seed, cs in randoms.items()
        for c in cs
    ]
    table = pl.DataFrame(rows, schema_overrides={"matched_to": pl.String})
    s = table.group_by("seed", "removal", "matched_to", "removal_percent").agg(
        pl.col("change").mean(), change_low=pl.col("change").min(), change_high=pl.col("change").max(), reps=pl.len()
    )
    got = checklist_module.replay_beats_random(s, "gas")
    assert got.verdict == verdict, got.detail
    assert "probability 6.2e-02" in got.detail  # (1/4)^2: two cells, three random sets each


def test_rank_correlation_interval_matches_explicit_resampling():
    """Each bootstrap replicate of the draw rank correlation is the plain correlation of the ranks with every
    training step's rows repeated as often as the replicate drew the step."""
    rng = np.random.default_rng(3)
    steps = np.repeat(np.arange(12), 8)
    a = rng.normal(size=steps.size) + steps * 0.1
    b = a + rng.normal(scale=0.8, size=steps.size)
    point, low, high = tables.spearman_interval(a, b, steps, 50, 7)
    assert point == pytest.approx(_brute_spearman(a, b), abs=1e-12)
    ra, rb = (pl.Series(v).rank("average").to_numpy() for v in (a, b))
    draws = np.random.default_rng(7).multinomial(12, np.full(12, 1 / 12), size=50)
    explicit = []
    for counts in draws:
        rows = np.concatenate([np.flatnonzero(steps == s).repeat(c) for s, c in enumerate(counts)])
        explicit.append(np.corrcoef(ra[rows], rb[rows])[0, 1])
    assert (low, high) == pytest.approx(tuple(np.percentile(explicit, [2.5, 97.5])), abs=1e-12)
    assert low < point < high


def test_sd_and_spread_ranges_match_a_grid_search():
    lows, highs = np.array([0.50, 0.55, 0.62]), np.array([0.58, 0.60, 0.70])
    grid = np.array(list(itertools.product(*[np.linspace(lo, hi, 41) for lo, hi in zip(lows, highs, strict=True)])))
    sds, spreads = grid.std(axis=1, ddof=1), grid.max(axis=1) - grid.min(axis=1)
    low, high = checklist_module.sd_range(lows, highs)
    assert low == pytest.approx(sds.min(), abs=2e-3) and low <= sds.min() + 1e-12
    assert high == pytest.approx(sds.max(), abs=1e-12)
    assert tables.spread_range(lows, highs) == pytest.approx((spreads.min(), spreads.max()), abs=1e-12)


def _seed_rows(cells):
    return pl.DataFrame(
        [
            _row_of(seed, draw, value, low, high)
            for seed, per_draw in enumerate(cells)
            for draw, (value, low, high) in enumerate(per_draw)
        ]
    )


def _row_of(seed, draw, value, low, high):
    return {
        "run": "t",
        "arm": "planted",
        "seed": seed,
        "draw": draw,
        "estimator": "gas",
        "target": "forced",
        "level": "rollout",
        "stratum": "all",
        "metric": "within_group_auc_fluency_resid",
        "value": value,
        "ci_low": low,
        "ci_high": high,
        "n": 100,
    }


@pytest.mark.parametrize(
    "cells,verdict",
    [
        ([[(0.70, 0.68, 0.72)], [(0.71, 0.69, 0.73)], [(0.72, 0.70, 0.74)]], "pass"),  # tight and all above
        ([[(0.60, 0.52, 0.68)], [(0.70, 0.62, 0.78)], [(0.66, 0.58, 0.74)]], "inconclusive"),  # sd 0.05 possible
        ([[(0.55, 0.53, 0.57)], [(0.75, 0.73, 0.77)], [(0.90, 0.88, 0.92)]], "fail"),  # sd above 0.05 for sure
        ([[(0.60, 0.55, 0.65)], [(0.58, 0.49, 0.67)], [(0.62, 0.57, 0.67)]], "inconclusive"),  # one seed straddles
        ([[(0.54, 0.52, 0.56)], [(0.47, 0.45, 0.49)], [(0.52, 0.51, 0.53)]], "fail"),  # above and below 0.5
    ],
)
def test_stable_across_seeds_three_valued(cells, verdict):
    got = checklist_module.stable_across_seeds(_seed_rows(cells), "gas", "forced", "all", 0.05)
    assert got.verdict == verdict, got.detail


@pytest.mark.parametrize(
    "corr,draws,verdict",
    [
        ((0.90, 0.88, 0.92), [(0.70, 0.69, 0.71), (0.70, 0.69, 0.71)], "pass"),
        ((0.81, 0.78, 0.84), [(0.70, 0.69, 0.71), (0.70, 0.69, 0.71)], "inconclusive"),  # correlation straddles 0.8
        ((0.76, 0.74, 0.78), [(0.70, 0.69, 0.71), (0.70, 0.69, 0.71)], "fail"),  # wholly below 0.8
        ((0.90, 0.88, 0.92), [(0.70, 0.67, 0.73), (0.75, 0.72, 0.78)], "inconclusive"),  # a spread over 0.05 possible
        ((0.90, 0.88, 0.92), [(0.70, 0.69, 0.71), (0.80, 0.79, 0.81)], "fail"),  # the spread is over 0.05 for sure
    ],
)
def test_stable_across_draws_three_valued(corr, draws, verdict):
    row = {"seed": 0, "estimator": "gas", "target": "forced", "draws": 2}
    names = ("rank_correlation_min", "rank_correlation_min_ci_low", "rank_correlation_min_ci_high")
    row.update(zip(names, corr, strict=True))
    metrics = _seed_rows([draws])
    got = checklist_module.stable_across_draws(pl.DataFrame([row]), metrics, "gas", "forced", "all", 0.8, 0.05)
    assert got.verdict == verdict, got.detail
