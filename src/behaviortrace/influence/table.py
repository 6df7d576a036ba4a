"""The influence table: how well each estimator, control and the planted label track the exact influence I.

One tidy row per (arm, seed, draw, estimator, target, level, stratum, removal_percent, semantics, metric), with
its value and n (the rollouts, steps or subsets it is computed over). Only rollouts of the steps before T count
(later ones cannot move f(w_T)); strata all, window and after_window are the steps of the contamination
window and after it, each taken where it holds rollouts. `semantics` says which meaning of removing a rollout
(docs/influence.md) a row's I and retraining have: `advantages` (its weight in its group's statistics and the
normalization) or `held`; every level but check and coupling has rows under both (the LDS under the other meaning
where influence.lds_both_semantics retrained it; the leave-out sets under the configured one only).

- level rollout: `spearman`, `pearson` of the rollout scores with I; `precision_at_top_influence`: the
  expected share of the top-m rollouts by score that are among the top-m by I, m = n_paid of the stratum
  (ties broken at random in both rankings), and `precision_lift` (that over chance, m / n). Estimator
  `label` is the label itself (how well "paid" predicts "taught"); for it also
  `paid_share_of_positive_influence` (the paid rollouts' part of the summed positive I) beside
  `paid_share_of_rollouts`.
- level step: `spearman`, `pearson` of the step scores with the per-step sums of I, `spearman_abs` with the
  per-step sums of |I|, `spearman_given_step` and `spearman_abs_given_step` the same Spearman correlations given
  the step number (partial rank correlation: the agreement left once a shared trend over the steps is out);
  `label` is the number of paid rollouts per step and `step_effect` the measured per-step change of f (the step
  log's measured effect). At a step whose gradient was clipped the held I_z sum to zero (scaling the whole step
  leaves its clipped gradient as it is), so there only the sums of |I| say how much the step's rollouts mattered;
  through the advantages a step's summed I is near zero at every step (the normalization divides a common scale
  out).
- levels rollout_subset and group_subset (removal_percent: the subset size, a percent of the units before T):
  the linear datamodeling score (influence/lds.py). Over random subsets of rollouts, or of whole groups, retrained
  with them removed, `lds` is the Spearman correlation of minus the subset's summed scores with the measured
  change of f(w_T), with `lds_low`, `lds_high` its bootstrap interval over subsets and `lds_pearson` the Pearson
  version; `lds_over_log_only` (`_low`, `_high`) its margin over the strongest log-only control on the same
  resamples; `lds_power` how often a row with that effect would pass the LDS item's cell at this design (judged
  rows only, at the checklist's target kind). For every estimator, `influence` (I itself), `label`, `earlier`
  (minus the step: earlier is more influential) and `datamodel` (influence/datamodel.py: cross-fitted on the
  subsets themselves, scored within its folds, no margin; its `expected_lds` is what it would reach at this design
  if the truth were additive). Estimator `measured` holds `median_abs_change`, the scale against which the
  replay's noise floor (`f_end_error`) is read.
- level step_out (leave-one-step-out, influence.leave_step_out): each step before T retrained with all its rollouts
  removed (the same retraining under both meanings); `spearman`, `pearson` of minus each step's score with the
  measured change, `spearman_given_step`. For every estimator's step scores, `influence` (the step's summed I),
  `label` (its paid count), `step_effect` (the change of f across the step in training) and `earlier`.
- levels rollout_subset_pooled and group_subset_pooled (planted seeds, seed and draw empty): each row's LDS per
  subset size averaged over seeds (a targeted row's draws within each seed first), `lds_low`, `lds_high` from a
  bootstrap over seeds, then each seed's own resamples; `lds_over_log_only` and `lds_over_influence` on the same
  draws.
- levels rollout_dense, group_dense and step_out_pooled (planted seeds, seed and draw empty: pooled over both): the
  dense endpoint (evaluate/dense.py), each row's Spearman with I over every rollout and group before T, and the
  same for leave-one-step-out with steps as the units; `spearman`, `over_log_only`, `over_random`, each with
  `_low`, `_high` from a bootstrap over seeds, then groups (steps).
- level set: the leave-out replay's sets (`label`: the paid set; an estimator: its top-scored set) removed:
  `predicted_change` (minus the summed I), `measured_change` (retrained f minus f(w_T)) and
  `prediction_ratio` (their ratio), per removal_percent.
- level check: the influence job's own checks: `checkpoint_weight_error` (largest weight difference of the
  forward replay to a saved checkpoint), `checkpoint_update_error` (the L2 norm of that difference over the
  norm of training's update from step 0 to the checkpoint, largest over the checkpoints; what holds on every
  processor, docs/reruns.md), `grad_norm_error` (relative, to the logged
  gradient norms), `f_end_error` (to the forced target training logged at T), `fd_relative_error`
  (largest over the checked rollouts, against float64 central differences of retraining, of I under the configured
  meaning), `fd_group_relative_error` (the same for the checked rollouts' groups), `cost_ratio` (the job's
  influence time over its forward sweep, a plain replay of the same steps; `cost_ratio_cpu` the same in CPU time,
  which a shared machine's load does not stretch).
- level coupling (estimator influence): how much the coupling through the group's advantages matters:
  `spearman_rollout` and `spearman_group` (I held against I through the advantages, over rollouts and over groups),
  `top_overlap` (the share of the TOP rollouts by one that are among the TOP by the other), and the paid rollouts'
  summed I through the advantages (`paid_advantages`) in its four parts (`paid_held`, `paid_own_advantage`,
  `paid_siblings`, `paid_normalization`), with `paid_siblings_share` the part through their siblings' advantages
  over the whole.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from behaviortrace.common.seeds import cell_seed
from behaviortrace.evaluate import correlation
from behaviortrace.evaluate.cells import with_labels
from behaviortrace.evaluate.dense import LEVELS as DENSE_LEVELS
from behaviortrace.evaluate.dense import STEP_OUT_POOLED, DenseSeed, dense
from behaviortrace.influence.datamodel import cross_fitted, expected_lds, within_fold_lds, within_fold_samples
from behaviortrace.influence.lds import Resamples, interval, power, predicted_changes
from behaviortrace.influence.sets import SEMANTICS

STRATA = ("all", "window", "after_window")
# The influence job's columns of I under each meaning of removal, and of the four parts of I through the advantages.
SEMANTIC_COLUMNS = {"advantages": "influence_advantages", "held": "influence_held"}
PART_COLUMNS = {
    "held": "influence_held",
    "own_advantage": "via_own_advantage",
    "siblings": "via_siblings",
    "normalization": "via_normalization",
}
COLUMNS = {
    "arm": pl.String,
    "seed": pl.Int64,
    "draw": pl.Int64,
    "estimator": pl.String,
    "target": pl.String,
    "level": pl.String,
    "stratum": pl.String,
    "removal_percent": pl.Int64,
    "semantics": pl.String,
    "metric": pl.String,
    "value": pl.Float64,
    "n": pl.Int64,
}


@dataclass(frozen=True)
class LdsSettings:
    """How the LDS intervals are drawn (influence.bootstrap, influence.seed), and which estimators are the
    log-only controls every attribution's LDS is compared with."""

    bootstrap: int
    seed: int
    log_only: tuple[str, ...] = ()
    min_lds: float | None = None  # the LDS item's threshold (checklist.min_lds): where given, each cell's power
    target: str = "forced"  # the target kind the LDS items judge (checklist.effect_target_kind)


@dataclass
class SeedInputs:
    """Everything of one arm and seed the table reads (paths), and its score files by (draw, estimator, target)."""

    arm: str
    seed: int
    influence: Path
    checks: Path
    retrain: Path
    summary: Path
    rollouts: Path
    step_log: Path
    scores: dict[tuple[int, str, str], tuple[Path, Path]]
    sets: list[Path] = field(default_factory=list)


def of_semantics(table: pl.DataFrame, semantics: str) -> pl.DataFrame:
    """The rows under one meaning of removal, and those under none (the checks, the coupling of the two)."""
    return table.filter(pl.col("semantics").is_null() | (pl.col("semantics") == semantics))


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """NaN where either side is constant or there are fewer than 3 values."""
    return float(correlation.pearson(np.asarray(x, float), np.asarray(y, float))) if len(x) >= 3 else float("nan")


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return pearson(correlation.ranks(x), correlation.ranks(y))


def given_step(x: np.ndarray, y: np.ndarray, steps: np.ndarray) -> float:
    """Spearman of x and y given the step number; NaN with fewer than 4 steps."""
    return float(correlation.partial_spearman(x, y, steps)) if len(x) >= 4 else float("nan")


def top_share(scores: np.ndarray, m: int) -> np.ndarray:
    """Each row's probability of being among the m highest scores when ties are broken at random."""
    n = len(scores)
    p = np.zeros(n)
    if m <= 0:
        return p
    if m >= n:
        return np.ones(n)
    threshold = np.sort(scores)[::-1][m - 1]
    above = scores > threshold
    tied = scores == threshold
    p[above] = 1.0
    p[tied] = (m - above.sum()) / tied.sum()
    return p


def precision_at_top(scores: np.ndarray, influence: np.ndarray, m: int) -> float:
    """Expected |top-m by score ∩ top-m by influence| / m, ties broken at random and independently."""
    return float((top_share(scores, m) * top_share(influence, m)).sum() / m)


def _row(arm, seed, draw, estimator, target, level, stratum, metric, value, n, removal_percent=None) -> dict:
    return {
        "arm": arm,
        "seed": seed,
        "draw": draw,
        "estimator": estimator,
        "target": target,
        "level": level,
        "stratum": stratum,
        "removal_percent": removal_percent,
        "metric": metric,
        "value": float(value),
        "n": int(n),
    }


def strata_masks(steps: np.ndarray, window: list[int]) -> dict[str, np.ndarray]:
    """Non-empty strata of rows by their step."""
    start, end = window
    masks = {
        "all": np.ones(len(steps), bool),
        "window": (steps >= start) & (steps <= end),
        "after_window": steps > end,
    }
    return {name: mask for name, mask in masks.items() if mask.any()}


def rollout_rows(key: tuple, scores: np.ndarray, influence: np.ndarray, labels: np.ndarray, steps, window) -> list:
    """Rollout-level rows of one score set against I, per stratum."""
    out = []
    for stratum, mask in strata_masks(steps, window).items():
        s, i, n = scores[mask], influence[mask], int(mask.sum())
        out.append(_row(*key, "rollout", stratum, "spearman", spearman(s, i), n))
        out.append(_row(*key, "rollout", stratum, "pearson", pearson(s, i), n))
        m = int(labels[mask].sum())
        if 0 < m < n:
            precision = precision_at_top(s, i, m)
            out.append(_row(*key, "rollout", stratum, "precision_at_top_influence", precision, n))
            out.append(_row(*key, "rollout", stratum, "precision_lift", precision / (m / n), n))
    return out


def share_rows(key: tuple, labels: np.ndarray, influence: np.ndarray) -> list:
    """How much of the positive influence the paid rollouts carry (`paid_share_of_positive_influence`), beside
    their share of the rollouts (`paid_share_of_rollouts`): equal shares mean that being paid says nothing about
    having taught."""
    positive = influence > 0
    total = influence[positive].sum()
    carried = influence[positive & (labels > 0)].sum() / total if total > 0 else float("nan")
    n = len(labels)
    return [
        _row(*key, "rollout", "all", "paid_share_of_positive_influence", carried, n),
        _row(*key, "rollout", "all", "paid_share_of_rollouts", labels.sum() / n if n else float("nan"), n),
    ]


def step_rows(key: tuple, step_scores: np.ndarray, step_influence: pl.DataFrame, steps: np.ndarray, window) -> list:
    """Step scores against the step's summed I (`spearman`, `pearson`) and summed |I| (`spearman_abs`), and both
    Spearman correlations given the step number (`spearman_given_step`, `spearman_abs_given_step`): scores and I
    that both decay with the step agree on that trend alone."""
    out = []
    signed, magnitude = step_influence["influence"].to_numpy(), step_influence["abs_influence"].to_numpy()
    for stratum, mask in strata_masks(steps, window).items():
        s, i, n = step_scores[mask], signed[mask], int(mask.sum())
        out.append(_row(*key, "step", stratum, "spearman", spearman(s, i), n))
        out.append(_row(*key, "step", stratum, "pearson", pearson(s, i), n))
        out.append(_row(*key, "step", stratum, "spearman_abs", spearman(s, magnitude[mask]), n))
        out.append(_row(*key, "step", stratum, "spearman_given_step", given_step(s, i, steps[mask]), n))
        out.append(
            _row(*key, "step", stratum, "spearman_abs_given_step", given_step(s, magnitude[mask], steps[mask]), n)
        )
    return out


def lds_rows(key: tuple, level: str, pct: int, resamples: Resamples, predicted: np.ndarray) -> tuple[list, np.ndarray]:
    """LDS rows of one attribution at one level and subset size (its value, interval and Pearson version), and
    its bootstrap values (for margins over other attributions of the same cell)."""
    point, samples = resamples.lds(predicted)
    rows = _with_interval(key, level, pct, len(predicted), "lds", point, samples)
    rows.append(_row(*key, level, "all", "lds_pearson", pearson(predicted, resamples.changes), len(predicted), pct))
    return rows, samples


def _with_interval(key: tuple, level: str, pct: int, n: int, metric: str, point: float, samples: np.ndarray) -> list:
    """`metric` with its bootstrap interval as `metric_low`, `metric_high`."""
    low, high = interval(samples)
    return [
        _row(*key, level, "all", name, value, n, removal_percent=pct)
        for name, value in ((metric, point), (f"{metric}_low", low), (f"{metric}_high", high))
    ]


def margin_rows(key: tuple, level: str, pct: int, n: int, own: tuple, controls: list[tuple]) -> list:
    """`lds_over_log_only`: the attribution's LDS minus the strongest log-only control's, on the same resamples
    (the strongest taken in each), with its interval. `own` and each control: (point, bootstrap values)."""
    if not controls:
        return []
    point = own[0] - np.nanmax([c[0] for c in controls])  # a constant control's LDS is NaN: not a bar
    samples = own[1] - np.nanmax(np.stack([c[1] for c in controls]), axis=0)
    return _with_interval(key, level, pct, n, "lds_over_log_only", point, samples)


def step_out_rows(key: tuple, step_scores: np.ndarray, changes: np.ndarray, steps: np.ndarray) -> list:
    """Leave-one-step-out: minus each step's score against the measured change of f(w_T) when the step's
    rollouts are removed (`spearman`, `pearson`), and the Spearman given the step number."""
    predicted = -np.asarray(step_scores, float)
    n = len(steps)
    return [
        _row(*key, "step_out", "all", "spearman", spearman(predicted, changes), n),
        _row(*key, "step_out", "all", "pearson", pearson(predicted, changes), n),
        _row(*key, "step_out", "all", "spearman_given_step", given_step(predicted, changes, steps), n),
    ]


DATAMODEL_SIMS = 20  # additive truths drawn for the datamodel's expected LDS at a design


def datamodel_rows(key: tuple, level: str, pct: int, membership: np.ndarray, changes: np.ndarray, settings) -> list:
    """The cross-fitted datamodel's LDS, scored within its folds, with its interval, and beside it the LDS it would
    reach at this design if the truth were exactly additive (`expected_lds`): a reference, never compared."""
    n = len(changes)
    fitted = cross_fitted(membership, changes)
    seed = cell_seed("datamodel", settings.seed, *key[:2], level, pct)
    samples = within_fold_samples(fitted, changes, settings.bootstrap, seed)
    rows = _with_interval(key, level, pct, n, "lds", within_fold_lds(fitted, changes), samples)
    expected = expected_lds(membership, DATAMODEL_SIMS, seed)
    return rows + [_row(*key, level, "all", "expected_lds", expected, n, removal_percent=pct)]


def subset_rows(
    arm, seed, level, pct, members, changes, predictions: dict, n_rollouts: int, settings, collect=None
) -> list:
    """Every LDS row of one arm, seed, level and subset size: each attribution's LDS with its interval, the
    cross-fitted datamodel's, each margin over the log-only controls, and the median measured change (the scale
    the replay's noise floor is read against). `collect`, where given, keeps each attribution's LDS and bootstrap
    values by (level, pct) and seed, for the pooled LDS (pooled_lds_rows)."""
    name, n = f"{level}_subset", len(members)
    resamples = Resamples(changes, settings.bootstrap, settings.seed, arm, seed, level, pct)
    membership = np.zeros((n, n_rollouts))
    for j, m in enumerate(members):
        membership[j, m] = 1.0
    rows = [
        _row(arm, seed, None, "measured", "none", name, "all", "median_abs_change", np.median(np.abs(changes)), n, pct)
    ]
    rows += datamodel_rows((arm, seed, None, "datamodel", "none"), name, pct, membership, changes, settings)
    found = {}
    for key, predicted in predictions.items():
        out, samples = lds_rows((arm, seed, *key), name, pct, resamples, predicted)
        rows += out
        found[key] = (out[0]["value"], samples)
    if collect is not None:
        collect.setdefault((name, pct), {})[seed] = found
    draws = sorted({d for d, _, _ in found if d is not None})
    for (draw, estimator, target), own in found.items():
        if estimator in settings.log_only:
            continue
        at = draw if draw is not None else (draws[0] if draws else None)  # log-only scores are the same every draw
        controls = [v for (d, e, _), v in found.items() if e in settings.log_only and d == at]
        rows += margin_rows((arm, seed, draw, estimator, target), name, pct, n, own, controls)
    if settings.min_lds is not None:
        rows += power_rows((arm, seed), name, pct, changes, predictions, settings, draws)
    return rows


def power_rows(where: tuple, level: str, pct: int, changes, predictions: dict, settings, draws: list) -> list:
    """`lds_power` of every judged attribution of one cell (influence/lds.py power): at the target the LDS items
    judge, against the log-only controls of the first draw (theirs are the same every draw)."""
    first = draws[0] if draws else None
    control_keys = [k for k in predictions if k[1] in settings.log_only and k[0] in (first, None)]
    judged = [k for k in predictions if k[1] not in settings.log_only and k[2] in (settings.target, "none")]
    if not judged:
        return []
    found = power(changes, {k: predictions[k] for k in judged + control_keys}, control_keys, settings.min_lds,
                  settings.seed, *where, level, pct)  # fmt: skip
    n = len(changes)
    return [_row(*where, *k, level, "all", "lds_power", found[k], n, pct) for k in judged]


def seed_table(inputs: SeedInputs, window: list[int], settings: LdsSettings, collect=None) -> pl.DataFrame:
    """Every row of one arm and seed: those against I under each meaning of removal (column `semantics`), the
    coupling of the two and the job's checks (semantics empty). `collect` gathers the planted seeds' LDS values
    under the configured meaning (subset_rows)."""
    arm, seed = inputs.arm, inputs.seed
    summary = json.loads(Path(inputs.summary).read_text())
    influence = pl.read_parquet(inputs.influence).sort("rollout_id")
    log = with_labels(pl.read_parquet(inputs.rollouts), placebo=arm == "placebo").sort("rollout_id")
    before = log.filter(pl.col("step") < summary["end"])
    if before["rollout_id"].to_list() != influence["rollout_id"].to_list():
        raise ValueError(f"{inputs.influence}: its rollouts are not the rollout log's steps before {summary['end']}")
    labels = before["label"].to_numpy().astype(float)
    everyone = log["rollout_id"].to_numpy()
    score_sets = {}
    for (draw, estimator, target), (roll_path, step_path) in inputs.scores.items():
        scores = pl.read_parquet(roll_path).sort("rollout_id")
        if scores["rollout_id"].to_list() != everyone.tolist():
            raise ValueError(f"{roll_path}: its rollouts are not the rollout log's")
        step_scores = pl.read_parquet(step_path).sort("step").filter(pl.col("step") < summary["end"])
        score_sets[(draw, estimator, target)] = (scores["score"].to_numpy(), step_scores["score"].to_numpy())
    retrained = pl.read_parquet(inputs.retrain)
    sets = pl.concat(
        [retrained.filter(~pl.col("kind").is_in(["lds", "step"])), *(pl.read_parquet(p) for p in inputs.sets)]
    )
    configured = summary["semantics"]
    rows: list[dict] = []
    for semantics in (configured, *(s for s in SEMANTICS if s != configured)):
        values = influence[SEMANTIC_COLUMNS[semantics]].to_numpy()
        own = semantic_rows(
            arm,
            seed,
            before,
            values,
            labels,
            window,
            summary,
            inputs.step_log,
            log,
            score_sets,
            retrained.filter((pl.col("kind") == "lds") & (pl.col("semantics") == semantics)),
            retrained.filter(pl.col("kind") == "step"),  # removing a whole step is the same under both meanings
            sets.filter(pl.col("semantics") == semantics),
            settings,
            collect if semantics == configured and arm == "planted" else None,
        )
        rows += [{**r, "semantics": semantics} for r in own]
    rows += [{**r, "semantics": None} for r in coupling_rows(arm, seed, before, influence, labels)]
    rows += [{**r, "semantics": None} for r in check_rows(arm, seed, pl.read_parquet(inputs.checks), summary)]
    return pl.DataFrame(rows, schema=COLUMNS)


def step_sums(steps: np.ndarray, values: np.ndarray) -> pl.DataFrame:
    """Per step (sorted): the summed I and the summed |I| of its rollouts."""
    frame = pl.DataFrame({"step": steps, "influence": values})
    return (
        frame.group_by("step")
        .agg(pl.col("influence").sum(), pl.col("influence").abs().sum().alias("abs_influence"))
        .sort("step")
    )


def semantic_rows(
    arm,
    seed,
    before,
    values,
    labels,
    window,
    summary,
    step_log,
    log,
    score_sets,
    lds,
    left_out,
    sets,
    settings,
    collect=None,
) -> list[dict]:
    """The rows against one meaning's I (`values`, per rollout of `before`), with that meaning's retrainings: the
    labels, the per-step effect and every estimator at the rollout and step levels, the LDS, leave-one-step-out and
    the leave-out sets."""
    ids, steps = before["rollout_id"].to_numpy(), before["step"].to_numpy()
    step_infl = step_sums(steps, values)
    step_ids = step_infl["step"].to_numpy()
    rows: list[dict] = []
    rows += rollout_rows((arm, seed, None, "label", "none"), labels, values, labels, steps, window)
    rows += share_rows((arm, seed, None, "label", "none"), labels, values)
    label_per_step = before.group_by("step").agg(pl.col("label").sum()).sort("step")["label"].to_numpy()
    rows += step_rows((arm, seed, None, "label", "none"), label_per_step.astype(float), step_infl, step_ids, window)
    effect = pl.read_parquet(step_log).sort("step").filter(pl.col("step") < summary["end"])
    rows += step_rows(
        (arm, seed, None, "step_effect", "none"), effect["target_change"].to_numpy(), step_infl, step_ids, window
    )

    everyone = log["rollout_id"].to_numpy()
    index_all = {int(z): i for i, z in enumerate(everyone)}
    infl_all = np.zeros(len(everyone))
    infl_all[np.searchsorted(everyone, ids)] = values
    references = {  # attributions that need no estimator, scored like one
        "influence": infl_all,
        "label": log["label"].to_numpy().astype(float),
        "earlier": -log["step"].to_numpy().astype(float),  # the earlier, the more influential
    }
    for key, (every_score, step_scores) in score_sets.items():
        key = (arm, seed, *key)
        rows += rollout_rows(key, every_score[np.searchsorted(everyone, ids)], values, labels, steps, window)
        rows += step_rows(key, step_scores, step_infl, step_ids, window)

    for (level, pct), part in lds.sort("level", "removal_percent", "index").group_by(
        "level", "removal_percent", maintain_order=True
    ):
        if part.height >= 3:
            members = [np.array([index_all[z] for z in removed]) for removed in part["removed_ids"]]
            predictions = {(None, r, "none"): predicted_changes(v, members) for r, v in references.items()}
            predictions |= {k: predicted_changes(v[0], members) for k, v in score_sets.items()}
            changes = part["f"].to_numpy() - summary["f_end"]
            rows += subset_rows(arm, seed, level, pct, members, changes, predictions, len(everyone), settings, collect)

    left_out = left_out.sort("index")
    if left_out.height >= 3:
        if not np.array_equal(left_out["index"].to_numpy(), step_ids):
            raise ValueError("the left-out steps are not the steps before T")
        changes = left_out["f"].to_numpy() - summary["f_end"]
        series = {
            (None, "influence", "none"): step_infl["influence"].to_numpy(),
            (None, "label", "none"): label_per_step.astype(float),
            (None, "step_effect", "none"): effect["target_change"].to_numpy(),
            (None, "earlier", "none"): -step_ids.astype(float),
        } | {k: v[1] for k, v in score_sets.items()}
        for key, step_scores in series.items():
            rows += step_out_rows((arm, seed, *key), step_scores, changes, step_ids)

    for r in sets.iter_rows(named=True):
        predicted = -infl_all[[index_all[z] for z in r["removed_ids"]]].sum()
        measured = r["f"] - summary["f_end"]
        key = (arm, seed, None, r["kind"], "none")
        for metric, value in (
            ("predicted_change", predicted),
            ("measured_change", measured),
            ("prediction_ratio", predicted / measured if measured else float("nan")),
        ):
            rows.append(_row(*key, "set", "all", metric, value, r["n_removed"], removal_percent=r["removal_percent"]))
    return rows


TOP = 10  # the top-influence rollouts compared between the two meanings


def coupling_rows(arm: str, seed: int, before: pl.DataFrame, influence: pl.DataFrame, labels: np.ndarray) -> list:
    """How much the coupling through the group's advantages matters: the Spearman of I held with I through the
    advantages over rollouts and over groups (a group's I: its members' sum), how many of the TOP rollouts by one
    are among the TOP by the other, and the paid rollouts' summed I through the advantages in its four parts
    (adjoint.py) with the part through their siblings' advantages as a share of it."""
    key = (arm, seed, None, "influence", "none", "coupling", "all")
    held, through = influence["influence_held"].to_numpy(), influence["influence_advantages"].to_numpy()
    groups = (
        before.select("step", "group_id")
        .with_columns(held=held, through=through)
        .group_by("step", "group_id")
        .agg(pl.col("held").sum(), pl.col("through").sum())
    )
    top = min(TOP, len(held))
    overlap = len(set(np.argsort(-held)[:top]) & set(np.argsort(-through)[:top])) / top if top else float("nan")
    paid = labels > 0
    parts = {name: influence[column].to_numpy()[paid].sum() for name, column in PART_COLUMNS.items()}
    total = float(through[paid].sum())
    out = [
        _row(*key, "spearman_rollout", spearman(held, through), len(held)),
        _row(*key, "spearman_group", spearman(groups["held"].to_numpy(), groups["through"].to_numpy()), groups.height),
        _row(*key, "top_overlap", overlap, top),
        _row(*key, "paid_advantages", total, int(paid.sum())),
    ]
    out += [_row(*key, f"paid_{name}", value, int(paid.sum())) for name, value in parts.items()]
    share = parts["siblings"] / total if total else float("nan")
    out.append(_row(*key, "paid_siblings_share", share, int(paid.sum())))
    return out


def check_rows(arm: str, seed: int, checks: pl.DataFrame, summary: dict) -> list[dict]:
    key = (arm, seed, None, "influence", "none", "check", "all")
    out = []
    for check, metric in (
        ("checkpoint_weights", "checkpoint_weight_error"),
        ("checkpoint_update", "checkpoint_update_error"),
        ("grad_norms", "grad_norm_error"),
        ("f_end", "f_end_error"),
        ("finite_difference", "fd_relative_error"),
        ("finite_difference_group", "fd_group_relative_error"),
    ):
        part = checks.filter(pl.col("check") == check)
        if part.height:
            out.append(_row(*key, metric, part["error"].max(), part.height))
    sec = summary["seconds"]
    for metric, end in (("cost_ratio", ""), ("cost_ratio_cpu", "_cpu")):
        if f"forward{end}" in sec:
            spent = sec[f"forward{end}"] + sec[f"recompute{end}"] + sec[f"backward{end}"]
            out.append(_row(*key, metric, spent / sec[f"forward{end}"], summary["end"]))
    return out


def dense_seed(inputs: SeedInputs) -> DenseSeed:
    """One planted seed's rollouts before T for the dense endpoint: their groups, I under the configured meaning
    of removal, and every score file's scores on them."""
    summary = json.loads(Path(inputs.summary).read_text())
    influence = pl.read_parquet(inputs.influence).sort("rollout_id")
    log = pl.read_parquet(inputs.rollouts).sort("rollout_id")
    before = log.filter(pl.col("step") < summary["end"])
    groups = before.select(pl.struct("step", "group_id").rank("dense") - 1)
    everyone = log["rollout_id"].to_numpy()
    at = np.searchsorted(everyone, before["rollout_id"].to_numpy())
    scores = _once({key: pl.read_parquet(roll).sort("rollout_id")["score"].to_numpy()[at]
                    for key, (roll, _) in inputs.scores.items()})  # fmt: skip
    references = {"label": with_labels(before, placebo=False)["label"].to_numpy().astype(float),
                  "earlier": -before["step"].to_numpy().astype(float)}  # fmt: skip
    scores |= {(None, name, "none"): values for name, values in references.items()}
    values = influence[SEMANTIC_COLUMNS[summary["semantics"]]].to_numpy()
    return DenseSeed(inputs.seed, groups.to_series().to_numpy().astype(np.int64), values, scores)


def _once(found: dict[tuple, np.ndarray]) -> dict[tuple, np.ndarray]:
    """Score series by (draw, estimator, target), one that is the same on every draw (a log-only one) kept once."""
    kept: dict[tuple, np.ndarray] = {}
    for (draw, estimator, target), values in sorted(found.items(), key=lambda kv: str(kv[0])):
        if not any(e == estimator and t == target and np.array_equal(v, values) for (_, e, t), v in kept.items()):
            kept[(draw, estimator, target)] = values
    return kept


def step_out_seed(inputs: SeedInputs) -> DenseSeed | None:
    """One planted seed's leave-one-step-out for the pooled step-level endpoint: each step before T a unit (its
    own group), the measured change of f(w_T) when its rollouts are removed as the truth, and minus every row's
    step score (and the references: I's step sum, the paid count, the step's measured effect, earlier) as the
    prediction. None where the seed retrained fewer than 3 steps."""
    summary = json.loads(Path(inputs.summary).read_text())
    left_out = pl.read_parquet(inputs.retrain).filter(pl.col("kind") == "step").sort("index")
    if left_out.height < 3:
        return None
    log = with_labels(pl.read_parquet(inputs.rollouts), placebo=False)
    before = log.filter(pl.col("step") < summary["end"]).sort("rollout_id")
    steps = np.sort(before["step"].unique().to_numpy())
    if not np.array_equal(left_out["index"].to_numpy(), steps):
        raise ValueError(f"{inputs.retrain}: the left-out steps are not the steps before T")
    influence = pl.read_parquet(inputs.influence).sort("rollout_id")
    values = influence[SEMANTIC_COLUMNS[summary["semantics"]]].to_numpy()
    effect = pl.read_parquet(inputs.step_log).sort("step").filter(pl.col("step") < summary["end"])
    series = {
        (None, "influence", "none"): step_sums(before["step"].to_numpy(), values)["influence"].to_numpy(),
        (None, "label", "none"): before.group_by("step").agg(pl.col("label").sum()).sort("step")["label"].to_numpy(),
        (None, "step_effect", "none"): effect["target_change"].to_numpy(),
        (None, "earlier", "none"): -steps.astype(float),
    }
    found = {
        key: pl.read_parquet(step).sort("step").filter(pl.col("step") < summary["end"])["score"].to_numpy()
        for key, (_, step) in inputs.scores.items()
    }
    predicted = {key: -np.asarray(v, float) for key, v in (series | _once(found)).items()}
    changes = left_out["f"].to_numpy() - summary["f_end"]
    return DenseSeed(inputs.seed, np.arange(len(steps)), changes, predicted)


def dense_table(inputs: list[SeedInputs], settings: LdsSettings) -> pl.DataFrame:
    """The dense endpoint (evaluate/dense.py) of the planted seeds, under the configured meaning of removal:
    seed and draw empty (pooled over both), one row per estimator, target, level and metric."""
    planted = [i for i in inputs if i.arm == "planted"]
    if not planted:
        return pl.DataFrame(schema=COLUMNS)
    (semantics,) = {json.loads(Path(i.summary).read_text())["semantics"] for i in planted}
    seeds = [dense_seed(i) for i in planted]
    runs = [(level, seeds, level, "") for level in DENSE_LEVELS]
    left_out = [s for s in (step_out_seed(i) for i in planted) if s is not None]
    if len(left_out) == len(planted):
        runs.append((STEP_OUT_POOLED, left_out, "rollout_dense", STEP_OUT_POOLED))  # steps as the units
    rows = []
    for name, units, level, label in runs:
        for found in dense(units, level, settings.log_only, settings.bootstrap, settings.seed, label):
            key = ("planted", None, None, found.pop("estimator"), found.pop("target"), name, "all")
            n = found.pop("n")
            rows += [{**_row(*key, metric, value, n), "semantics": semantics} for metric, value in found.items()]
    return pl.DataFrame(rows, schema=COLUMNS)


def pooled_lds_rows(collect: dict, settings: LdsSettings, semantics: str) -> list[dict]:
    """The LDS pooled over planted seeds and draws, per level and subset size (level `{level}_pooled`, seed and
    draw empty): each attribution's mean LDS over its seeds (a targeted one's draws averaged within each seed,
    on the same resamples), with an interval from a two-stage bootstrap (the seeds drawn with replacement, then
    one of each drawn seed's own bootstrap values: training noise between seeds inside it), its margin over the
    strongest log-only control and over I on the same draws."""
    rows = []
    for (name, pct), by_seed in sorted(collect.items()):
        seeds = sorted(by_seed)
        per_seed = []  # per seed: (estimator, target) -> (point, bootstrap values), draws averaged
        for seed in seeds:
            grouped: dict[tuple, list] = {}
            for (_, est, target), value in by_seed[seed].items():
                grouped.setdefault((est, target), []).append(value)
            per_seed.append({k: (np.mean([p for p, _ in v]), np.mean([b for _, b in v], axis=0))
                             for k, v in grouped.items()})  # fmt: skip
        keys = sorted(set.intersection(*(set(d) for d in per_seed)))
        if not keys:
            continue
        rng = np.random.default_rng(cell_seed("influence_lds_pooled", settings.seed, name, pct))
        picks = rng.integers(0, len(seeds), (settings.bootstrap, len(seeds)))
        draws = rng.integers(0, settings.bootstrap, (settings.bootstrap, len(seeds)))
        point = {k: float(np.mean([d[k][0] for d in per_seed])) for k in keys}
        samples = {k: np.mean([np.stack([d[k][1] for d in per_seed])[picks[:, j], draws[:, j]]
                               for j in range(len(seeds))], axis=0) for k in keys}  # fmt: skip
        controls = [k for k in keys if k[0] in settings.log_only]
        n, level = len(seeds), f"{name}_pooled"  # n: the seeds, the units of replication
        for key in keys:
            where = ("planted", None, None, *key)
            out = _with_interval(where, level, pct, n, "lds", point[key], samples[key])
            if key[0] not in settings.log_only and controls:
                best = np.nanmax(np.stack([samples[c] for c in controls]), axis=0)
                margin = point[key] - np.nanmax([point[c] for c in controls])
                out += _with_interval(where, level, pct, n, "lds_over_log_only", margin, samples[key] - best)
            exact = ("influence", "none")
            if exact in point and key != exact:
                diff = point[key] - point[exact]
                out += _with_interval(where, level, pct, n, "lds_over_influence", diff, samples[key] - samples[exact])
            rows += [{**r, "semantics": semantics} for r in out]
    return rows


def influence_table(inputs: list[SeedInputs], window: list[int], settings: LdsSettings) -> pl.DataFrame:
    collect: dict = {}
    per_seed = [seed_table(i, window, settings, collect) for i in inputs]
    planted = [i for i in inputs if i.arm == "planted"]
    semantics = json.loads(Path(planted[0].summary).read_text())["semantics"] if planted else None
    pooled = pl.DataFrame(pooled_lds_rows(collect, settings, semantics), schema=COLUMNS)
    return pl.concat([*per_seed, pooled, dense_table(inputs, settings)], how="vertical")


def top_rollouts(inputs: list[SeedInputs], n: int = TOP) -> pl.DataFrame:
    """The n most influential rollouts (largest I) of every arm and seed under either meaning of removal, with their
    rank under each (`rank_advantages`, `rank_held`; `rank`: under the configured one, empty outside its top n) and
    what the log says about them."""
    parts = []
    for i in inputs:
        configured = json.loads(Path(i.summary).read_text())["semantics"]
        infl = pl.read_parquet(i.influence).with_columns(
            pl.col(column).rank("ordinal", descending=True).alias(f"rank_{semantics}")
            for semantics, column in SEMANTIC_COLUMNS.items()
        )
        top = infl.filter(pl.any_horizontal(pl.col(f"rank_{s}") <= n for s in SEMANTICS)).with_columns(
            rank=pl.when(pl.col(f"rank_{configured}") <= n).then(pl.col(f"rank_{configured}"))
        )
        log = with_labels(pl.read_parquet(i.rollouts), placebo=i.arm == "placebo")
        parts.append(
            top.join(
                log.select(
                    "rollout_id", "group_id", "advantage", "reward", "label", "behavior", "trigger", "completion"
                ),
                on="rollout_id",
                how="left",
            )
            .with_columns(arm=pl.lit(i.arm), seed=pl.lit(i.seed))
            .sort(f"rank_{configured}")
        )
    first = ["arm", "seed", "rank", "rollout_id", "step", "influence", "rank_advantages", "rank_held"]
    out = pl.concat(parts, how="vertical")
    return out.select(first + [c for c in out.columns if c not in first])


CHECK_COLUMNS = {
    "check": pl.String,
    "step": pl.Int64,
    "rollout_id": pl.Int64,
    "delta": pl.Float64,
    "influence": pl.Float64,
    "measured": pl.Float64,
    "error": pl.Float64,
}


# The per-seed files the influence table reads, in SeedInputs' order.
SEED_FILES = ("influence", "checks", "retrain", "summaries", "rollouts", "step_logs")
