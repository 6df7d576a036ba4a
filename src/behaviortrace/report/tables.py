"""Cross-seed tables: the tidy union of every metric, the summary with mean ± sd across seeds, and the
draw- and seed-stability tables.

A seed's value is the mean over its generation draws; intervals stay per draw, since each comes from its
own cluster bootstrap.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import polars as pl

from behaviortrace.common.markdown import markdown_table, mean_sd
from behaviortrace.config.sections import Checklist

PLANTED, PLACEBO = "planted", "placebo"
# Rows of the metrics table that are not estimators: paid counts and behavior-token cosines.
NOT_ESTIMATORS = ("label", "behavior_tokens")
# Metrics of the summary: (metric, levels it exists at, heading).
SUMMARY_METRICS = [
    ("lift", ("step", "step_summed", "rollout"), "Lift (precision at n_paid / chance)"),
    ("auroc", ("rollout",), "AUROC"),
    ("within_group_auc", ("rollout",), "Within-group AUC, raw"),
    ("within_group_auc_fluency_resid", ("rollout",), "Within-group AUC, fluency-residualized"),
    ("advantage_matched_auc", ("rollout",), "Advantage-matched AUC (paid vs rollouts of its step with its advantage)"),
    ("behavior_matched_auc", ("rollout",), "Behavior-matched AUC (among behavior-showing trigger rollouts)"),
    ("behavior_matched_lift", ("step", "step_summed"), "Behavior-matched step lift (the same rollouts, step scores)"),
    ("effect_spearman", ("effect",), "Step scores against each step's measured behavior change (Spearman)"),
    (
        "effect_spearman_given_step",
        ("effect",),
        "The same given the step number (partial Spearman: the agreement beyond a shared trend over the steps)",
    ),
    ("effect_pearson", ("effect",), "Step scores against each step's measured behavior change (Pearson)"),
    ("effect_share", ("effect",), "Share of the total measured change predicted (sum of step scores / sum of changes)"),
]


KEYS = ["run", "arm", "seed", "draw", "estimator", "target", "level", "stratum", "metric"]


def collect_metrics(files: list[tuple[str, Path]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The tidy union of the evaluate outputs, each tagged with its arm (planted or placebo), and apart from it the
    bootstrap replicates of the metrics that keep them (keys and `replicates`), for paired comparisons."""
    frames = [pl.read_parquet(path).with_columns(arm=pl.lit(arm)) for arm, path in files]
    table = pl.concat(frames, how="vertical")
    table = table.select(KEYS + [c for c in table.columns if c not in KEYS]).sort(KEYS)
    replicates = table.filter(pl.col("replicates").is_not_null()).select(*KEYS, "replicates")
    return table.drop("replicates"), replicates


def judged(metrics: pl.DataFrame, target: str, stratum: str = "all", arm: str = PLANTED) -> pl.DataFrame:
    """The rows a verdict reads: one arm and stratum, targeted estimators at `target`, controls at none."""
    return metrics.filter(
        (pl.col("arm") == arm) & (pl.col("stratum") == stratum) & pl.col("target").is_in([target, "none"])
    )


def estimators_of(metrics: pl.DataFrame) -> list[str]:
    """The estimators evaluated on the planted run."""
    names = metrics.filter(pl.col("arm") == PLANTED)["estimator"].unique().to_list()
    return sorted(set(names) - set(NOT_ESTIMATORS))


def per_seed(metrics: pl.DataFrame) -> pl.DataFrame:
    """One value per seed: the mean over draws."""
    keys = ["arm", "seed", "estimator", "target", "level", "stratum", "metric"]
    return metrics.group_by(keys).agg(pl.col("value").mean(), pl.len().alias("draws")).sort(keys)


def summary_markdown(metrics: pl.DataFrame, strata: list[str]) -> str:
    """Per estimator, target and level: each seed's value and the mean ± sd across seeds."""
    planted = metrics.filter(pl.col("arm") == PLANTED)
    seeds = sorted(planted["seed"].unique().to_list())
    seed_values = per_seed(planted)
    parts = [
        "# Summary across seeds\n",
        f"Run `{metrics['run'][0]}`, {len(seeds)} seeds. Each seed's value is the mean over its "
        f"{planted['draw'].n_unique()} generation draws; the last column is the mean ± sd (n − 1) across "
        "seeds. Intervals per seed and draw are in `metrics.csv`. Targeted estimators appear once per "
        "target kind; controls use no target (`none`).\n",
    ]
    for stratum in strata:
        for metric, levels, heading in SUMMARY_METRICS:
            rows = []
            cell = seed_values.filter(
                (pl.col("metric") == metric) & (pl.col("stratum") == stratum) & pl.col("level").is_in(levels)
            )
            for (est, target, level), grp in cell.group_by(["estimator", "target", "level"], maintain_order=True):
                by_seed = dict(zip(grp["seed"].to_list(), grp["value"].to_list(), strict=False))
                values = [by_seed.get(s) for s in seeds]
                rows.append(
                    [est, target, level, *[v if v is not None else float("nan") for v in values], mean_sd(values)]
                )
            if rows:
                parts.append(f"## {heading} — stratum `{stratum}`\n")
                parts.append(
                    markdown_table(["estimator", "target", "level", *[f"seed {s}" for s in seeds], "mean ± sd"], rows)
                )
    return "\n".join(parts)


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation with average ranks for ties, over rows where both scores are finite."""
    keep = np.isfinite(a) & np.isfinite(b)
    if keep.sum() < 3:
        return float("nan")
    ranks = pl.DataFrame({"a": a[keep], "b": b[keep]}).select(pl.all().rank("average"))
    ra, rb = ranks["a"].to_numpy(), ranks["b"].to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return 1.0 if np.array_equal(a[keep], b[keep]) else float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def spread_range(lows: np.ndarray, highs: np.ndarray) -> tuple[float, float]:
    """The smallest and the largest max − min of values that each lie within their interval."""
    return max(0.0, float(np.max(lows) - np.min(highs))), float(np.max(highs) - np.min(lows))


def spearman_interval(a: np.ndarray, b: np.ndarray, clusters: np.ndarray, n_boot: int, seed: int) -> tuple:
    """The rank correlation of `a` and `b` and its 95% interval from a bootstrap over whole clusters (training
    steps), the ranks held fixed: per-cluster sums of the ranks, their squares and products make each replicate
    one matrix product."""
    keep = np.isfinite(a) & np.isfinite(b)
    point = _spearman(a, b)
    if keep.sum() < 3 or not np.isfinite(point):
        return point, float("nan"), float("nan")
    ranks = pl.DataFrame({"a": a[keep], "b": b[keep]}).select(pl.all().rank("average"))
    ra, rb = ranks["a"].to_numpy(), ranks["b"].to_numpy()
    ids, inverse = np.unique(clusters[keep], return_inverse=True)
    sums = np.stack([np.bincount(inverse, weights=v, minlength=len(ids)) for v in (np.ones_like(ra), ra, rb)])
    cross = np.stack([np.bincount(inverse, weights=v, minlength=len(ids)) for v in (ra * ra, rb * rb, ra * rb)])
    rng = np.random.default_rng(seed)
    w = rng.multinomial(len(ids), np.full(len(ids), 1 / len(ids)), size=n_boot).astype(np.float64)
    n, sa, sb = (w @ sums.T).T
    saa, sbb, sab = (w @ cross.T).T
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = (sab - sa * sb / n) / np.sqrt((saa - sa * sa / n) * (sbb - sb * sb / n))
    corr = corr[np.isfinite(corr)]
    low, high = np.percentile(corr, [2.5, 97.5]) if len(corr) else (np.nan, np.nan)
    return point, float(low), float(high)


def draw_stability(
    metrics: pl.DataFrame,
    score_files: dict[tuple[int, str, str, int], Path],
    spread_metrics: list[tuple[str, str]],
    n_boot: int = 200,
    boot_seed: int = 0,
) -> pl.DataFrame:
    """Per seed, estimator and target: the smallest rank correlation of rollout scores between two draws, with
    its interval (a bootstrap over training steps, `n_boot` resamples seeded by `boot_seed` and the seed), and
    the spread (max − min over draws) of each (level, metric) in `spread_metrics`, stratum all."""
    planted = metrics.filter((pl.col("arm") == PLANTED) & (pl.col("stratum") == "all"))
    rows = []
    keys = sorted({k[:3] for k in score_files})
    for seed, est, target in keys:
        draws = sorted(d for s, e, t, d in score_files if (s, e, t) == (seed, est, target))
        scores = {d: pl.read_parquet(score_files[(seed, est, target, d)]).sort("rollout_id") for d in draws}
        corrs = [
            spearman_interval(
                scores[a]["score"].to_numpy(),
                scores[b]["score"].to_numpy(),
                scores[a]["step"].to_numpy(),
                n_boot,
                boot_seed + seed,
            )
            for a, b in itertools.combinations(draws, 2)
        ]
        lowest = min(corrs, key=lambda c: c[0]) if corrs else (float("nan"),) * 3
        row = {
            "seed": seed,
            "estimator": est,
            "target": target,
            "draws": len(draws),
            "rank_correlation_min": lowest[0],
            "rank_correlation_min_ci_low": lowest[1],
            "rank_correlation_min_ci_high": lowest[2],
        }
        for level, metric in spread_metrics:
            v = planted.filter(
                (pl.col("seed") == seed)
                & (pl.col("estimator") == est)
                & (pl.col("target") == target)
                & (pl.col("level") == level)
                & (pl.col("metric") == metric)
            )
            nan = float("nan")
            row[f"{metric}_{level}_spread"] = float(v["value"].max() - v["value"].min()) if v.height else nan
            low, high = spread_range(v["ci_low"].to_numpy(), v["ci_high"].to_numpy()) if v.height else (nan, nan)
            row[f"{metric}_{level}_spread_low"], row[f"{metric}_{level}_spread_high"] = low, high
        rows.append(row)
    return pl.DataFrame(rows)


def both_ways(metrics: pl.DataFrame, estimator: str, metric: str) -> pl.DataFrame:
    """`metrics` with `estimator`'s `metric` (an AUC: 0.5 is chance) taken both ways. A predictor with AUC 0.3
    ranks as well as one with 0.7, reversed, so a control read one way only would be beaten by anything above
    0.5. Value max(v, 1 - v); the interval folded at 0.5 (lower bound 0.5 where it straddles 0.5)."""
    sel = (pl.col("estimator") == estimator) & (pl.col("metric") == metric)
    v, low, high = pl.col("value"), pl.col("ci_low"), pl.col("ci_high")
    return metrics.with_columns(
        value=pl.when(sel).then(pl.max_horizontal(v, 1 - v)).otherwise(v),
        ci_low=pl.when(sel).then(pl.max_horizontal(low, 1 - high, pl.lit(0.5))).otherwise(low),
        ci_high=pl.when(sel).then(pl.max_horizontal(high, 1 - low)).otherwise(high),
    )


def beats_table(
    metrics: pl.DataFrame,
    estimator: str,
    controls: list[str],
    level: str,
    metric: str,
    stratum: str,
    target: str,
    two_sided: bool = False,
) -> pl.DataFrame:
    """Per seed and draw: does the estimator's interval lie wholly above that of the strongest of `controls`
    (`beats`), or wholly below that of one of them (`below`)?

    The strongest control is the one with the highest upper bound in that cell, and at step level each control
    is taken at its strongest step variant, so that beating it means beating every control and both the summed
    and the step-level rankings. `control` names the strongest; `control_low` is the highest lower bound. With
    `two_sided`, the controls are taken both ways (`both_ways`).
    """
    rows = judged(metrics, target, stratum).filter(pl.col("metric") == metric)
    for control in controls if two_sided else []:
        rows = both_ways(rows, control, metric)
    est = rows.filter((pl.col("estimator") == estimator) & (pl.col("level") == level))
    levels = ["step", "step_summed"] if level == "step" else [level]
    ctl = (
        rows.filter(pl.col("estimator").is_in(controls) & pl.col("level").is_in(levels))
        .sort("ci_high", "estimator", descending=[True, False])
        .group_by(["seed", "draw"], maintain_order=True)
        .agg(
            pl.col("ci_high").first().alias("control_high"),
            pl.col("estimator").first().alias("control"),
            pl.col("ci_low").max().alias("control_low"),
        )
    )
    out = est.select("seed", "draw", "value", "ci_low", "ci_high").join(ctl, on=["seed", "draw"], how="inner")
    return out.with_columns(
        beats=pl.col("ci_low") > pl.col("control_high"), below=pl.col("ci_high") < pl.col("control_low")
    ).sort("seed", "draw")


def seed_stability(
    metrics: pl.DataFrame, target: str, stratum: str, comparisons: list[tuple[str, str, str, str]]
) -> pl.DataFrame:
    """On how many seeds each estimator beats each control (non-overlapping intervals on every draw).

    `comparisons`: (name, controls, level, metric, two_sided), judged against the strongest of the controls."""
    estimators = estimators_of(metrics)
    seeds = sorted(metrics.filter(pl.col("arm") == PLANTED)["seed"].unique().to_list())
    rows = []
    for est in estimators:
        row = {"estimator": est, "seeds": len(seeds)}
        for name, controls, level, metric, two_sided in comparisons:
            if est in controls:
                row[name] = None
                continue
            t = beats_table(metrics, est, controls, level, metric, stratum, target, two_sided)
            per = t.group_by("seed").agg(pl.col("beats").all())
            row[name] = int(per["beats"].sum()) if t.height else None
        rows.append(row)
    return pl.DataFrame(rows)


def stability_markdown(draws: pl.DataFrame, seeds: pl.DataFrame, cfg: Checklist) -> str:
    parts = [
        "# Stability across generation draws and seeds\n",
        "## Across draws\n",
        "Per seed: the lowest Spearman rank correlation of an estimator's rollout scores between two "
        "generation draws (the draws resample the probe completions that build the targets; target-free "
        "controls do not depend on them), and the spread (max − min) of its metrics across draws, "
        "stratum `all`.\n",
    ]
    cols = [c for c in draws.columns if c not in ("draws",)]
    parts.append(markdown_table(cols, [list(r) for r in draws.select(cols).iter_rows()]))
    parts += [
        "## Across seeds\n",
        f"On how many seeds each estimator's interval lies wholly above the control's, on every draw "
        f"(target `{cfg.target_kind}`, stratum `{cfg.stratum}`; step level: `{cfg.step_metric}`, "
        f"rollout level: `{cfg.rollout_metric}`, fluency: `{cfg.fluency_metric}`). "
        "– marks the control itself.\n",
    ]
    parts.append(markdown_table(seeds.columns, [["–" if v is None else v for v in r] for r in seeds.iter_rows()]))
    return "\n".join(parts)


SUMMARY_STRATA = ["all", "below_saturation", "saturated"]
