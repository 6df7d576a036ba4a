"""Metrics of every estimator against the label (the paid rollouts), per stratum, with cluster
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
from behaviortrace.evaluate.effect import EFFECT_STRATA, MEASURED_TARGET, EffectCell, label_per_step

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
    "replicates",
]
# Metrics whose bootstrap replicates are kept (column `replicates`): the checklist compares an estimator with a
# control on them as paired differences, on the same resamples of the same cell.
PAIRED_METRICS = frozenset(
    {"lift", "precision_at_paid", "auroc", "average_precision", "within_group_auc", "within_group_auc_fluency_resid"}
)
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
    """One stratum of one seed and draw: its rows, labels, groups and bootstrap weights.

    `advantage_match` is the largest advantage difference of a pair in the advantage-matched AUC.
    """

    def __init__(
        self,
        rollouts: pl.DataFrame,
        fluency: np.ndarray,
        mask: np.ndarray,
        n_boot: int,
        seed: int,
        advantage_match: float = 0.0,
        permutations: int = 1000,
    ):
        self.mask, self.seed, self.advantage_match, self.permutations = mask, seed, advantage_match, permutations
        sub = rollouts.filter(pl.Series(mask))
        self.labels = sub["label"].to_numpy().astype(np.float64)
        self.steps = sub["step"].to_numpy()
        self.groups = self.steps * 1_000_000 + sub["group_id"].to_numpy()
        self.fluency = fluency[mask]
        self.advantage = sub["advantage"].to_numpy().astype(np.float64)
        # The rollouts the plant can pay: they show the behavior and their prompt has the trigger.
        self.payable = (sub["behavior"] & sub["trigger"]).to_numpy()
        self.zero_advantage = int((sub["label"] & (sub["advantage"] == 0)).sum())
        self.weights, self.group_w = bootstrap_weights(self.groups, n_boot, seed) if mask.any() else (None, None)

    def rows(self, keep: np.ndarray) -> Cell:
        """The cell's rows where `keep`, with the same bootstrap replicates (each row keeps its group's weight)."""
        sub = Cell.__new__(Cell)
        sub.mask = None  # rows of the parent cell, not of the seed: `keep` says which
        sub.keep, sub.seed, sub.advantage_match = keep, cell_seed(self.seed, "rows"), self.advantage_match
        sub.permutations = self.permutations
        for name in ("labels", "steps", "groups", "fluency", "advantage", "payable"):
            setattr(sub, name, getattr(self, name)[keep])
        sub.zero_advantage = int(((sub.labels != 0) & (sub.advantage == 0)).sum())
        sub.weights, sub.group_w = self.weights.take(keep), None
        return sub

    @cached_property
    def behavior_matched(self) -> Cell | None:
        """The payable rollouts (behavior shown, trigger present), where paid and unpaid differ by eligibility
        alone: a control that reads the behavior ties them all. None without both paid and unpaid among them."""
        sub = self.rows(self.payable)
        return sub if 0 < sub.n_paid < sub.n else None

    @cached_property
    def advantage_pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """paid-vs-other pairs of one step whose advantages differ by at most `advantage_match`."""
        return M.matched_pairs(self.labels, self.steps, self.advantage, self.advantage_match)

    @cached_property
    def step_weights(self) -> np.ndarray:
        """Bootstrap weights of whole steps [1 + B, steps], for pairs that cross prompt groups inside a step."""
        return bootstrap_weights(self.steps, self.weights.replicates - 1, cell_seed(self.seed, "steps"))[1]

    @cached_property
    def chance(self) -> np.ndarray:
        return M.chance(self.labels, self.weights)

    @cached_property
    def step_ceiling(self) -> np.ndarray:
        """Best precision at n_paid when a step's rollouts share one score (depends on no estimator)."""
        return M.ceiling(self.steps, self.labels, self.weights)

    @cached_property
    def step_null(self) -> np.ndarray:
        """Step-level lift of `permutations` random step orderings (the permutation null): what a target-free
        random ranking of steps reaches. It depends on no estimator, so it is computed once per cell."""
        steps, block = np.unique(self.steps, return_inverse=True)
        pos = np.bincount(block, weights=self.labels, minlength=len(steps))
        cnt = np.bincount(block, minlength=len(steps)).astype(float)
        rng = np.random.default_rng(self.seed)
        orders = np.stack([rng.permutation(len(steps)) for _ in range(self.permutations)])
        return M.fill_blocks(pos[orders], cnt[orders]) / (pos.sum() / cnt.sum())

    @property
    def step_chance_band(self) -> np.ndarray:
        """The null's mean (1 in expectation) as the point value, then the null itself (its 95% range)."""
        return np.r_[self.step_null.mean(), self.step_null]

    def step_p_value(self, lift: float, side: str) -> float:
        """Permutation p-value of a step-level lift: two-sided (as far from the null's mean, either way) or
        greater (at least as high). Counting the observed ordering as one of the null's keeps it exact."""
        null = self.step_null
        if not np.isfinite(lift):
            return float("nan")
        if side == "greater":
            extreme = null >= lift - 1e-12
        else:
            centre = null.mean()
            extreme = np.abs(null - centre) >= abs(lift - centre) - 1e-12
        return float((1 + extreme.sum()) / (1 + len(null)))

    @cached_property
    def rollout_ceiling(self) -> np.ndarray:
        return M.ceiling(np.arange(self.n), self.labels, self.weights)

    @cached_property
    def step_of_row(self) -> tuple[np.ndarray, np.ndarray]:
        """Distinct steps and each row's index among them, to spread step scores over rows."""
        return np.unique(self.steps, return_inverse=True)

    def per_step(self, step: pl.DataFrame, column: str) -> np.ndarray:
        """The step table's `column` at each of the cell's distinct steps."""
        value_of = dict(zip(step["step"].to_list(), step[column].to_list(), strict=False))
        return np.array([value_of[s] for s in self.step_of_row[0].tolist()])

    def per_row(self, step: pl.DataFrame, column: str) -> np.ndarray:
        """The step table's `column` at each row's step."""
        return self.per_step(step, column)[self.step_of_row[1]]

    @cached_property
    def paid_steps(self) -> np.ndarray:
        """Whether each distinct step paid a bonus: the paper's step-level label, the paid steps."""
        steps, inverse = self.step_of_row
        return np.bincount(inverse, weights=self.labels, minlength=len(steps)) > 0

    @cached_property
    def step_units(self) -> M.Weights:
        """Bootstrap weights with every step one unit (resampled whole, as `step_weights` draws them)."""
        return M.Weights(self.step_weights.T, np.arange(len(self.paid_steps)))

    @property
    def n(self) -> int:
        return len(self.labels)

    @property
    def n_paid(self) -> int:
        return int(self.labels.sum())


def _summary(values: np.ndarray) -> tuple[float, float, float]:
    boot = values[1:][np.isfinite(values[1:])]
    low, high = np.percentile(boot, [2.5, 97.5]) if len(boot) else (np.nan, np.nan)
    return float(values[0]), float(low), float(high)


def _rows(key: dict, named: dict[str, tuple[np.ndarray, int]]) -> list[dict]:
    out = []
    for metric, (values, n) in named.items():
        value, low, high = _summary(values)
        kept = values[1:].astype(np.float32).tolist() if metric in PAIRED_METRICS and len(values) > 1 else None
        out.append(
            {**key, "metric": metric, "value": value, "ci_low": low, "ci_high": high, "n": n, "replicates": kept}
        )
    return out


def precision_metrics(cell: Cell, precision: np.ndarray, ceiling: np.ndarray) -> dict:
    chance = cell.chance
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "precision_at_paid": (precision, cell.n),
            "chance": (chance, cell.n),
            "lift": (precision / chance, cell.n),
            "ceiling": (ceiling, cell.n),
            "ceiling_lift": (ceiling / chance, cell.n),
        }


def rollout_metrics(cell: Cell, scores: np.ndarray, fluency_match: float, min_matched_pairs: int) -> dict:
    ranking = M.ranking_metrics(scores, cell.labels, cell.weights)
    out = {"auroc": (ranking["auroc"], cell.n), "average_precision": (ranking["average_precision"], cell.n)}
    out.update(precision_metrics(cell, ranking["precision_at_paid"], cell.rollout_ceiling))
    # Against a random ordering of the rows: what the random control must be consistent with.
    auroc_p = M.auroc_p_value(ranking["auroc"][0], scores, cell.labels)
    lift_p = M.precision_p_value(ranking["precision_at_paid"][0], cell.n, cell.n_paid)
    out["auroc_p"], out["lift_p"] = (np.array([auroc_p]), cell.n), (np.array([lift_p]), cell.n)
    conc, total, _ = M.pair_counts(scores, cell.labels, cell.groups)
    out["within_group_auc"] = (M.within_group_auc(conc, total, cell.group_w), int(total.sum()))
    resid = M.residualize(scores, cell.fluency, cell.groups)
    conc, total, _ = M.pair_counts(resid, cell.labels, cell.groups)
    out["within_group_auc_fluency_resid"] = (M.within_group_auc(conc, total, cell.group_w), int(total.sum()))
    conc, total, _ = M.pair_counts(scores, cell.labels, cell.groups, cell.fluency, fluency_match)
    pairs = int(total.sum())
    out["matched_pair_auc"] = (M.within_group_auc(conc, total, cell.group_w), pairs)
    # 1 when there are too few matched pairs for the matched-pair AUC to mean much.
    out["matched_pair_underpowered"] = (np.full(len(cell.group_w), float(pairs < min_matched_pairs)), pairs)
    # Metrics the log-only controls cannot win by construction. Advantage-matched: paid rollouts against rollouts of its
    # step with about its advantage, the scores less their within-step linear trend in the advantage (the
    # advantage control leaves exactly nothing). Behavior-matched: the payable rollouts alone.
    pairs = cell.advantage_pairs
    adjusted = M.residualize(scores, cell.advantage, cell.steps)
    out["advantage_matched_auc"] = (M.pair_auc(adjusted, pairs, cell.step_weights), len(pairs[0]))
    matched = cell.behavior_matched
    if matched is not None:
        auc = M.auroc(scores[matched.keep], matched.labels, matched.weights)
        out["behavior_matched_auc"] = (auc, matched.n)
        p = M.auroc_p_value(auc[0], scores[matched.keep], matched.labels, "greater")
        out["behavior_matched_auc_p"] = (np.array([p]), matched.n)
    return out


def step_level_metrics(cell: Cell, step: pl.DataFrame, column: str) -> dict:
    """Precision at n_paid, lift and the permutation band when each row takes its step's `column` score, and the
    lift among the payable rollouts alone (where a step's share of paid rollouts is its share of eligible ones)."""
    precision = M.precision_at_paid(cell.per_row(step, column), cell.labels, cell.weights)
    out = precision_metrics(cell, precision, cell.step_ceiling)
    out["lift_chance_band"] = (cell.step_chance_band, cell.n)
    out["lift_p"] = (np.array([cell.step_p_value(out["lift"][0][0], "two-sided")]), cell.n)
    out.update(paid_steps_metrics(cell, cell.per_step(step, column)))
    matched = cell.behavior_matched
    if matched is not None:
        precision = M.precision_at_paid(matched.per_row(step, column), matched.labels, matched.weights)
        with np.errstate(invalid="ignore", divide="ignore"):
            lift = precision / matched.chance
        out["behavior_matched_lift"] = (lift, matched.n)
        out["behavior_matched_lift_chance_band"] = (matched.step_chance_band, matched.n)
        out["behavior_matched_lift_p"] = (np.array([matched.step_p_value(lift[0], "greater")]), matched.n)
    return out


def paid_steps_metrics(cell: Cell, scores: np.ndarray) -> dict:
    """The paper's step-level metric: steps as units, the label the steps that paid a bonus, precision of as many
    top-scored steps as there are paid steps (ties in expectation), its chance (paid steps / steps) and their ratio.
    Unlike precision at n_paid, a step counts once however many of its rollouts were paid."""
    labels, weights = cell.paid_steps.astype(np.float64), cell.step_units
    precision = M.precision_at_paid(scores, labels, weights)
    chance = M.chance(labels, weights)
    n = len(labels)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "precision_at_paid_steps": (precision, n),
            "chance_paid_steps": (chance, n),
            "lift_paid_steps": (precision / chance, n),
        }


def with_labels(rollouts: pl.DataFrame, placebo: bool = False) -> pl.DataFrame:
    """The `label` column: the paid rollouts. A placebo run pays no bonus, so its label is the set that
    would have been paid (eligible and showing the behavior), which no estimator should find enriched."""
    return rollouts.with_columns(label=(pl.col("eligible") & pl.col("behavior")) if placebo else pl.col("paid"))


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
    advantage_match: float = 0.0,
    permutations: int = 1000,
    strata: tuple[str, ...] = STRATA,
    token: dict | None = None,
    changes: pl.DataFrame | None = None,
    predicts_change: frozenset = frozenset(),
) -> pl.DataFrame:
    """Tidy metrics for every (estimator, target) in `scores`, every level and stratum.

    `rollouts` and `fluency` are in sketch-row order; each scores entry is (rollout scores, step scores).
    `token`: behavior-token inputs (see token_metrics), or None to skip the token level. The label
    are the `label` column (see with_labels), else the paid rollouts. `changes`: each step's measured
    change of the forced target (evaluate/effect.py), for the effect level, where `predicts_change` names the
    estimators whose step scores predict it in its units. `advantage_match`: the advantage-matched AUC's largest
    advantage difference of a pair; `permutations`: random step orderings behind the step-level null; `strata`:
    which of STRATA to evaluate (all of them in the workflow).
    """
    if "label" not in rollouts.columns:
        rollouts = with_labels(rollouts)
    masks = strata_masks(rollouts, window, probe_rate, saturation)
    masks = {name: mask for name, mask in masks.items() if name in strata}
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
        seed_of_cell = cell_seed(eval_seed, run, seed, draw, stratum)
        cell = Cell(rollouts, fluency, mask, n_boot, seed_of_cell, advantage_match, permutations)
        base = {"run": run, "seed": seed, "draw": draw, "stratum": stratum}
        rows.append(
            {
                **base,
                "estimator": "label",
                "target": "none",
                "level": "rollout",
                "metric": "paid_unfindable",
                "value": float(cell.zero_advantage),
                "ci_low": np.nan,
                "ci_high": np.nan,
                "n": cell.n_paid,
            }
        )
        if changes is not None and stratum in EFFECT_STRATA:
            rows += effect_rows(base, changes, rollouts, mask, scores, predicts_change, n_boot, eval_seed, run)
        if cell.n == 0 or cell.n_paid == 0:
            continue
        for (estimator, target), (roll, step) in scores.items():
            key = {**base, "estimator": estimator, "target": target}
            roll_scores = _aligned(roll, rollouts)[mask]
            rows += _rows(
                {**key, "level": "rollout"}, rollout_metrics(cell, roll_scores, fluency_match, min_matched_pairs)
            )
            rows += _rows({**key, "level": "step"}, step_level_metrics(cell, step, "score"))
            if not step["score_summed"].is_nan().all():
                rows += _rows({**key, "level": "step_summed"}, step_level_metrics(cell, step, "score_summed"))
        if token is not None:
            rows += token_metrics(cell, base, token)
    return (
        pl.DataFrame(rows, schema={c: _dtype(c) for c in COLUMNS}, orient="row")
        if rows
        else pl.DataFrame(schema={c: _dtype(c) for c in COLUMNS})
    )


def effect_rows(base, changes, rollouts, mask, scores, predicts_change, n_boot, eval_seed, run) -> list[dict]:
    """Effect-level rows of one stratum: every score set, and the label's count per step."""
    seed_parts = (eval_seed, run, base["seed"], base["draw"], "effect", base["stratum"])
    cell = EffectCell(changes, np.unique(rollouts["step"].to_numpy()[mask]), n_boot, cell_seed(*seed_parts))
    rows = _rows(
        {**base, "estimator": "label", "target": "none", "level": "effect"},
        cell.metrics(label_per_step(rollouts), with_share=False),
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
        "replicates": pl.List(pl.Float32),
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
