"""Metrics of every estimator against the ground truth (boosted rollouts), per stratum, with cluster
bootstrap intervals over prompt groups.

The bootstrap draws whole prompt groups (step, group) with replacement. Its random generator is seeded
from (run, seed, draw, stratum) only, so a cell's interval never depends on which cells were computed
before it, and every estimator in a stratum is judged on the same resamples (paired comparisons).
"""

from __future__ import annotations

import logging
import time
from functools import cached_property

import numpy as np
import polars as pl

from behaviortrace.common.seeds import cell_seed
from behaviortrace.evaluate import metrics as M
from behaviortrace.evaluate.effect import EFFECT_STRATA, MEASURED_TARGET, EffectCell, gt_per_step

COLUMNS = [
    "run",
    "seed",
    "draw",
    "estimator",
    "target",
    "level",
    "stratum",
    "metric",
    "value",
    "ci_low",
    "ci_high",
    "n",
]
log = logging.getLogger(__name__)
STRATA = ("all", "window", "after_window", "below_saturation", "saturated")


def strata_masks(rollouts: pl.DataFrame, window: list[int], probe_rate: np.ndarray, saturation: float) -> dict:
    step = rollouts["step"].to_numpy()
    return {
        "all": np.ones(len(step), bool),
        "window": (step >= window[0]) & (step <= window[1]),
        "after_window": step > window[1],
        "below_saturation": probe_rate < saturation,
        "saturated": probe_rate >= saturation,
    }


def bootstrap_weights(clusters: np.ndarray, n_boot: int, seed: int) -> tuple[M.Weights, np.ndarray]:
    """Row weights of 1 + n_boot replicates (the first: the point estimate), kept per cluster (see M.Weights),
    and the cluster weights [1 + n_boot, clusters]."""
    ids, inverse = np.unique(clusters, return_inverse=True)
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(len(ids), np.full(len(ids), 1 / len(ids)), size=n_boot).astype(np.float64)
    cluster_w = np.vstack([np.ones(len(ids)), counts])
    return M.Weights(cluster_w.T, inverse), cluster_w


class Cell:
    """One stratum of one seed and draw: its rows, labels, groups and bootstrap weights."""

    def __init__(self, rollouts: pl.DataFrame, fluency: np.ndarray, mask: np.ndarray, n_boot: int, seed: int):
        self.mask, self.seed = mask, seed
        sub = rollouts.filter(pl.Series(mask))
        self.labels = sub["label"].to_numpy().astype(np.float64)
        self.steps = sub["step"].to_numpy()
        self.groups = self.steps * 1_000_000 + sub["group_id"].to_numpy()
        self.fluency = fluency[mask]
        self.zero_advantage = int((sub["label"] & (sub["advantage"] == 0)).sum())
        self.weights, self.group_w = bootstrap_weights(self.groups, n_boot, seed) if mask.any() else (None, None)

    @cached_property
    def chance(self) -> np.ndarray:
        return M.chance(self.labels, self.weights)

    @cached_property
    def step_ceiling(self) -> np.ndarray:
        """Best precision at |GT| when a step's rollouts share one score (depends on no estimator)."""
        return M.ceiling(self.steps, self.labels, self.weights)

    @cached_property
    def step_chance_band(self) -> np.ndarray:
        """Step-level lift of random step orderings (the permutation null), [1 + n_boot]: what a target-free
        random ranking of steps reaches. It depends on no estimator, so it is computed once per cell."""
        steps, block = np.unique(self.steps, return_inverse=True)
        pos = np.bincount(block, weights=self.labels, minlength=len(steps))
        cnt = np.bincount(block, minlength=len(steps)).astype(float)
        rng = np.random.default_rng(self.seed)
        orders = [np.arange(len(steps))] + [rng.permutation(len(steps)) for _ in range(self.weights.replicates - 1)]
        lifts = M.fill_blocks(pos[orders], cnt[orders]) / (pos.sum() / cnt.sum())
        lifts[0] = lifts[1:].mean()  # the point value: the null's mean (1 in expectation)
        return lifts

    @cached_property
    def rollout_ceiling(self) -> np.ndarray:
        return M.ceiling(np.arange(self.n), self.labels, self.weights)

    @cached_property
    def step_of_row(self) -> tuple[np.ndarray, np.ndarray]:
        """Distinct steps and each row's index among them, to spread step scores over rows."""
        return np.unique(self.steps, return_inverse=True)

    def per_row(self, step: pl.DataFrame, column: str) -> np.ndarray:
        """The step table's `column` at each row's step."""
        value_of = dict(zip(step["step"].to_list(), step[column].to_list(), strict=False))
        steps, inverse = self.step_of_row
        return np.array([value_of[s] for s in steps.tolist()])[inverse]

    @property
    def n(self) -> int:
        return int(self.mask.sum())

    @property
    def n_gt(self) -> int:
        return int(self.labels.sum())


def _summary(values: np.ndarray) -> tuple[float, float, float]:
    boot = values[1:][np.isfinite(values[1:])]
    low, high = np.percentile(boot, [2.5, 97.5]) if len(boot) else (np.nan, np.nan)
    return float(values[0]), float(low), float(high)


def _rows(key: dict, named: dict[str, tuple[np.ndarray, int]]) -> list[dict]:
    out = []
    for metric, (values, n) in named.items():
        value, low, high = _summary(values)
        out.append({**key, "metric": metric, "value": value, "ci_low": low, "ci_high": high, "n": n})
    return out


def precision_metrics(cell: Cell, precision: np.ndarray, ceiling: np.ndarray) -> dict:
    chance = cell.chance
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "precision_at_gt": (precision, cell.n),
            "chance": (chance, cell.n),
            "lift": (precision / chance, cell.n),
            "ceiling": (ceiling, cell.n),
            "ceiling_lift": (ceiling / chance, cell.n),
        }


def rollout_metrics(cell: Cell, scores: np.ndarray, fluency_match: float, min_matched_pairs: int) -> dict:
    ranking = M.ranking_metrics(scores, cell.labels, cell.weights)
    out = {"auroc": (ranking["auroc"], cell.n), "average_precision": (ranking["average_precision"], cell.n)}
    out.update(precision_metrics(cell, ranking["precision_at_gt"], cell.rollout_ceiling))
    conc, total, _ = M.pair_counts(scores, cell.labels, cell.groups)
    out["within_group_auc"] = (M.within_group_auc(conc, total, cell.group_w), int(total.sum()))
    resid = M.residualize_on_fluency(scores, cell.fluency, cell.groups)
    conc, total, _ = M.pair_counts(resid, cell.labels, cell.groups)
    out["within_group_auc_fluency_resid"] = (M.within_group_auc(conc, total, cell.group_w), int(total.sum()))
    conc, total, _ = M.pair_counts(scores, cell.labels, cell.groups, cell.fluency, fluency_match)
    pairs = int(total.sum())
    out["matched_pair_auc"] = (M.within_group_auc(conc, total, cell.group_w), pairs)
    # 1 when there are too few matched pairs for the matched-pair AUC to mean much.
    out["matched_pair_underpowered"] = (np.full(len(cell.group_w), float(pairs < min_matched_pairs)), pairs)
    return out


def with_ground_truth(rollouts: pl.DataFrame, placebo: bool = False) -> pl.DataFrame:
    """The `label` column: the boosted rollouts. A placebo run pays no bonus, so its label is the set that
    would have been boosted (eligible and showing the behavior), which no estimator should find enriched."""
    return rollouts.with_columns(label=(pl.col("eligible") & pl.col("behavior")) if placebo else pl.col("boosted"))


def evaluate(
    *,
    run: str,
    seed: int,
    draw: int,
    rollouts: pl.DataFrame,
    fluency: np.ndarray,
    probe_rate: np.ndarray,
    scores: dict[tuple[str, str], tuple[pl.DataFrame, pl.DataFrame]],
    window: list[int],
    saturation: float,
    n_boot: int,
    eval_seed: int,
    fluency_match: float,
    min_matched_pairs: int = 100,
    token: dict | None = None,
    changes: pl.DataFrame | None = None,
    predicts_change: frozenset = frozenset(),
) -> pl.DataFrame:
    """Tidy metrics for every (estimator, target) in `scores`, every level and stratum.

    `rollouts` and `fluency` are in sketch-row order; each scores entry is (rollout scores, step scores).
    `token`: behavior-token inputs (see token_metrics), or None to skip the token level. The ground truth
    is the `label` column (see with_ground_truth), else the boosted rollouts. `changes`: each step's measured
    change of the forced target (evaluate/effect.py), for the effect level, where `predicts_change` names the
    estimators whose step scores predict it in its units.
    """
    if "label" not in rollouts.columns:
        rollouts = with_ground_truth(rollouts)
    masks = strata_masks(rollouts, window, probe_rate, saturation)
    rows: list[dict] = []
    started = time.time()
    for done, (stratum, mask) in enumerate(masks.items()):
        log.info(
            "stratum %d/%d (%s): %d rollouts, %d score sets; %.0f s so far",
            done + 1,
            len(masks),
            stratum,
            int(mask.sum()),
            len(scores),
            time.time() - started,
        )
        cell = Cell(rollouts, fluency, mask, n_boot, cell_seed(eval_seed, run, seed, draw, stratum))
        base = {"run": run, "seed": seed, "draw": draw, "stratum": stratum}
        rows.append(
            {
                **base,
                "estimator": "ground_truth",
                "target": "none",
                "level": "rollout",
                "metric": "gt_unfindable",
                "value": float(cell.zero_advantage),
                "ci_low": np.nan,
                "ci_high": np.nan,
                "n": cell.n_gt,
            }
        )
        if changes is not None and stratum in EFFECT_STRATA:
            rows += effect_rows(base, changes, rollouts, mask, scores, predicts_change, n_boot, eval_seed, run)
        if cell.n == 0 or cell.n_gt == 0:
            continue
        for (estimator, target), (roll, step) in scores.items():
            key = {**base, "estimator": estimator, "target": target}
            roll_scores = _aligned(roll, rollouts)[mask]
            rows += _rows(
                {**key, "level": "rollout"}, rollout_metrics(cell, roll_scores, fluency_match, min_matched_pairs)
            )
            step_scores = cell.per_row(step, "score")
            step_precision = M.precision_at_gt(step_scores, cell.labels, cell.weights)
            step_metrics = precision_metrics(cell, step_precision, cell.step_ceiling)
            step_metrics["lift_chance_band"] = (cell.step_chance_band, cell.n)
            rows += _rows({**key, "level": "step"}, step_metrics)
            summed = dict(zip(step["step"].to_list(), step["score_summed"].to_list(), strict=False))
            if not np.isnan(list(summed.values())).all():
                summed_precision = M.precision_at_gt(cell.per_row(step, "score_summed"), cell.labels, cell.weights)
                summed_metrics = precision_metrics(cell, summed_precision, cell.step_ceiling)
                summed_metrics["lift_chance_band"] = (cell.step_chance_band, cell.n)
                rows += _rows({**key, "level": "step_summed"}, summed_metrics)
        if token is not None:
            rows += token_metrics(cell, base, token)
    return (
        pl.DataFrame(rows, schema={c: _dtype(c) for c in COLUMNS}, orient="row")
        if rows
        else pl.DataFrame(schema={c: _dtype(c) for c in COLUMNS})
    )


def effect_rows(base, changes, rollouts, mask, scores, predicts_change, n_boot, eval_seed, run) -> list[dict]:
    """Effect-level rows of one stratum: every score set, and the ground truth's count per step."""
    seed_parts = (eval_seed, run, base["seed"], base["draw"], "effect", base["stratum"])
    cell = EffectCell(changes, np.unique(rollouts["step"].to_numpy()[mask]), n_boot, cell_seed(*seed_parts))
    rows = _rows(
        {**base, "estimator": "gt_per_step", "target": "none", "level": "effect"},
        cell.metrics(gt_per_step(rollouts), with_share=False),
    )
    for (estimator, target), (_, step) in scores.items():
        share = estimator in predicts_change and target == MEASURED_TARGET
        rows += _rows({**base, "estimator": estimator, "target": target, "level": "effect"}, cell.metrics(step, share))
    return rows


def _dtype(column: str):
    return {
        "seed": pl.Int64,
        "draw": pl.Int64,
        "n": pl.Int64,
        "value": pl.Float64,
        "ci_low": pl.Float64,
        "ci_high": pl.Float64,
    }.get(column, pl.Utf8)


def _aligned(scored: pl.DataFrame, rollouts: pl.DataFrame) -> np.ndarray:
    if not scored["rollout_id"].equals(rollouts["rollout_id"]):
        scored = rollouts.select("rollout_id").join(scored, on="rollout_id", how="left", maintain_order="left")
    return scored["score"].to_numpy()


def token_metrics(cell: Cell, base: dict, token: dict) -> list[dict]:
    """Mean cosine of behavior-token sketches with each target, against the same at random non-marker
    positions of the same completions (the null), with the gap between them."""
    rows = []
    for kind, (behavior_cos, null_cos) in token.items():
        b, z = behavior_cos[cell.mask], null_cos[cell.mask]
        use = np.isfinite(b) & np.isfinite(z)
        if not use.any():
            continue
        weight = cell.weights.sums(use.astype(np.float64))[0]
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_b = cell.weights.sums(use * np.nan_to_num(b))[0] / weight
            mean_z = cell.weights.sums(use * np.nan_to_num(z))[0] / weight
        n = int(use.sum())
        rows += _rows(
            {**base, "estimator": "behavior_tokens", "target": kind, "level": "token"},
            {"token_cosine": (mean_b, n), "token_cosine_null": (mean_z, n), "token_cosine_gap": (mean_b - mean_z, n)},
        )
    return rows
