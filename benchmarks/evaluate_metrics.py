"""How fast the evaluate stage's metrics are, against the implementation before the speed-up, measured in
the same run, with the two tables compared (they must agree to floating-point summation order).

The baseline (`old_*` below) is a copy of evaluate/cells.py and evaluate/metrics.py as they were: row
weights expanded to [B, n], level sums gathered by score order and summed with np.add.reduceat once per
metric, and a Python loop over prompt groups for the within-group pair counts.

    python benchmarks/evaluate_metrics.py     # synthetic data shaped like the default run (51,200 rollouts
                                              # in 6,400 groups of 8, 201 bootstrap replicates); ~30 s
    python benchmarks/evaluate_metrics.py --real results/default --seed 0 --draw 0
                                              # evaluate_job on real results (read only), old vs new
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from functools import cached_property
from pathlib import Path
from unittest import mock

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from behaviortrace.common.seeds import cell_seed  # noqa: E402
from behaviortrace.evaluate import cells  # noqa: E402
from behaviortrace.evaluate import metrics as M  # noqa: E402

KEY = ["run", "seed", "draw", "estimator", "target", "level", "stratum", "metric"]


# --- The baseline: metrics.py and cells.py before the speed-up ------------------------------------------------


def old_levels(scores):
    order = np.argsort(scores, kind="stable")
    s = scores[order]
    return order, np.flatnonzero(np.r_[True, s[1:] != s[:-1]])


def old_per_level(values, order, starts):
    return np.add.reduceat(values[:, order], starts, axis=1)


def old_auroc(scores, labels, weights):
    order, starts = old_levels(scores)
    pos = old_per_level(weights * labels, order, starts)
    neg = old_per_level(weights * (1 - labels), order, starts)
    below = np.cumsum(neg, axis=1) - neg
    with np.errstate(invalid="ignore", divide="ignore"):
        return (pos * (below + 0.5 * neg)).sum(1) / (pos.sum(1) * neg.sum(1))


def old_precision_at_gt(scores, labels, weights):
    order, starts = old_levels(-scores)
    pos = old_per_level(weights * labels, order, starts)
    cnt = old_per_level(weights, order, starts)
    m = pos.sum(1, keepdims=True)
    before_cnt = np.cumsum(cnt, axis=1) - cnt
    taken = np.clip(m - before_cnt, 0, cnt)
    with np.errstate(invalid="ignore", divide="ignore"):
        gained = np.where(cnt > 0, pos * taken / np.where(cnt > 0, cnt, 1), 0.0)
        return gained.sum(1) / m[:, 0]


def old_average_precision(scores, labels, weights):
    order, starts = old_levels(-scores)
    pos = old_per_level(weights * labels, order, starts)
    cnt = old_per_level(weights, order, starts)
    cum_cnt, cum_pos = np.cumsum(cnt, axis=1), np.cumsum(pos, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        prec = np.where(cum_cnt > 0, cum_pos / np.where(cum_cnt > 0, cum_cnt, 1), 0.0)
        return (prec * pos).sum(1) / pos.sum(1)


def old_chance(labels, weights):
    with np.errstate(invalid="ignore", divide="ignore"):
        return (weights * labels).sum(1) / weights.sum(1)


def old_ceiling(tie_blocks, labels, weights):
    _, block = np.unique(tie_blocks, return_inverse=True)
    n_blocks = block.max() + 1
    pos = np.zeros((weights.shape[0], n_blocks))
    cnt = np.zeros_like(pos)
    for b in range(weights.shape[0]):
        pos[b] = np.bincount(block, weights=weights[b] * labels, minlength=n_blocks)
        cnt[b] = np.bincount(block, weights=weights[b], minlength=n_blocks)
    with np.errstate(invalid="ignore", divide="ignore"):
        purity = np.where(cnt > 0, pos / np.where(cnt > 0, cnt, 1), -1.0)
    out = np.empty(weights.shape[0])
    for b in range(weights.shape[0]):
        best = np.argsort(-purity[b], kind="stable")
        out[b] = old_fill_blocks(pos[b, best], cnt[b, best])
    return out


def old_fill_blocks(pos, cnt):
    m = pos.sum()
    if m <= 0:
        return float("nan")
    before = np.cumsum(cnt) - cnt
    taken = np.clip(m - before, 0, cnt)
    share = np.where(cnt > 0, pos / np.where(cnt > 0, cnt, 1), 0.0)
    return float((share * taken).sum() / m)


def old_pair_counts(scores, labels, groups, fluency=None, max_gap=np.inf):
    ids, inverse = np.unique(groups, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.flatnonzero(np.r_[True, np.diff(inverse[order]) != 0, True])
    members = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=False)]
    conc, total = np.zeros(len(ids)), np.zeros(len(ids))
    for g, rows in enumerate(members):
        y = labels[rows].astype(bool)
        sp, sn = scores[rows][y][:, None], scores[rows][~y][None, :]
        close = np.ones((sp.shape[0], sn.shape[1]), bool)
        if fluency is not None:
            f = fluency[rows]
            close = np.abs(f[y][:, None] - f[~y][None, :]) <= max_gap
        conc[g] = ((sp > sn) & close).sum() + 0.5 * ((sp == sn) & close).sum()
        total[g] = close.sum()
    return conc, total, ids


class OldCell:
    def __init__(self, rollouts, fluency, mask, n_boot, seed):
        self.mask, self.seed = mask, seed
        sub = rollouts.filter(pl.Series(mask))
        self.labels = sub["label"].to_numpy().astype(np.float64)
        self.steps = sub["step"].to_numpy()
        self.groups = self.steps * 1_000_000 + sub["group_id"].to_numpy()
        self.fluency = fluency[mask]
        self.zero_advantage = int((sub["label"] & (sub["advantage"] == 0)).sum())
        self.row_w, self.group_w = (None, None)
        if mask.any():
            ids, inverse = np.unique(self.groups, return_inverse=True)
            rng = np.random.default_rng(seed)
            counts = rng.multinomial(len(ids), np.full(len(ids), 1 / len(ids)), size=n_boot).astype(np.float64)
            self.group_w = np.vstack([np.ones(len(ids)), counts])
            self.row_w = self.group_w[:, inverse]

    @cached_property
    def chance(self):
        return old_chance(self.labels, self.row_w)

    @cached_property
    def step_ceiling(self):
        return old_ceiling(self.steps, self.labels, self.row_w)

    @cached_property
    def step_chance_band(self):
        steps, block = np.unique(self.steps, return_inverse=True)
        pos = np.bincount(block, weights=self.labels, minlength=len(steps))
        cnt = np.bincount(block, minlength=len(steps)).astype(float)
        rng = np.random.default_rng(self.seed)
        lifts = [
            old_fill_blocks(pos[order], cnt[order])
            for order in [np.arange(len(steps))] + [rng.permutation(len(steps)) for _ in range(len(self.row_w) - 1)]
        ]
        lifts = np.array(lifts) / (pos.sum() / cnt.sum())
        lifts[0] = lifts[1:].mean()
        return lifts

    @cached_property
    def rollout_ceiling(self):
        return old_ceiling(np.arange(self.n), self.labels, self.row_w)

    @property
    def n(self):
        return int(self.mask.sum())

    @property
    def n_gt(self):
        return int(self.labels.sum())


def old_precision_metrics(cell, scores, ceiling):
    precision = old_precision_at_gt(scores, cell.labels, cell.row_w)
    chance = cell.chance
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "precision_at_gt": (precision, cell.n),
            "chance": (chance, cell.n),
            "lift": (precision / chance, cell.n),
            "ceiling": (ceiling, cell.n),
            "ceiling_lift": (ceiling / chance, cell.n),
        }


def old_rollout_metrics(cell, scores, fluency_match, min_matched_pairs):
    w = cell.row_w
    out = {
        "auroc": (old_auroc(scores, cell.labels, w), cell.n),
        "average_precision": (old_average_precision(scores, cell.labels, w), cell.n),
    }
    out.update(old_precision_metrics(cell, scores, cell.rollout_ceiling))
    conc, total, _ = old_pair_counts(scores, cell.labels, cell.groups)
    out["within_group_auc"] = (M.within_group_auc(conc, total, cell.group_w), int(total.sum()))
    resid = M.residualize_on_fluency(scores, cell.fluency, cell.groups)
    conc, total, _ = old_pair_counts(resid, cell.labels, cell.groups)
    out["within_group_auc_fluency_resid"] = (M.within_group_auc(conc, total, cell.group_w), int(total.sum()))
    conc, total, _ = old_pair_counts(scores, cell.labels, cell.groups, cell.fluency, fluency_match)
    pairs = int(total.sum())
    out["matched_pair_auc"] = (M.within_group_auc(conc, total, cell.group_w), pairs)
    out["matched_pair_underpowered"] = (np.full(len(cell.group_w), float(pairs < min_matched_pairs)), pairs)
    return out


def old_token_metrics(cell, base, token):
    rows = []
    for kind, (behavior_cos, null_cos) in token.items():
        b, z = behavior_cos[cell.mask], null_cos[cell.mask]
        use = np.isfinite(b) & np.isfinite(z)
        if not use.any():
            continue
        w = cell.row_w * use
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_b = (w * np.nan_to_num(b)).sum(1) / w.sum(1)
            mean_z = (w * np.nan_to_num(z)).sum(1) / w.sum(1)
        n = int(use.sum())
        rows += cells._rows(
            {**base, "estimator": "behavior_tokens", "target": kind, "level": "token"},
            {"token_cosine": (mean_b, n), "token_cosine_null": (mean_z, n), "token_cosine_gap": (mean_b - mean_z, n)},
        )
    return rows


def old_evaluate(
    *,
    run,
    seed,
    draw,
    rollouts,
    fluency,
    probe_rate,
    scores,
    window,
    saturation,
    n_boot,
    eval_seed,
    fluency_match,
    min_matched_pairs=100,
    token=None,
):
    if "label" not in rollouts.columns:
        rollouts = cells.with_ground_truth(rollouts)
    masks = cells.strata_masks(rollouts, window, probe_rate, saturation)
    rows = []
    for stratum, mask in masks.items():
        cell = OldCell(rollouts, fluency, mask, n_boot, cell_seed(eval_seed, run, seed, draw, stratum))
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
        if cell.n == 0 or cell.n_gt == 0:
            continue
        for (estimator, target), (roll, step) in scores.items():
            key = {**base, "estimator": estimator, "target": target}
            roll_scores = cells._aligned(roll, rollouts)[mask]
            rows += cells._rows(
                {**key, "level": "rollout"}, old_rollout_metrics(cell, roll_scores, fluency_match, min_matched_pairs)
            )
            step_of = dict(zip(step["step"].to_list(), step["score"].to_list(), strict=False))
            step_scores = np.array([step_of[s] for s in cell.steps])
            step_metrics = old_precision_metrics(cell, step_scores, cell.step_ceiling)
            step_metrics["lift_chance_band"] = (cell.step_chance_band, cell.n)
            rows += cells._rows({**key, "level": "step"}, step_metrics)
            summed = dict(zip(step["step"].to_list(), step["score_summed"].to_list(), strict=False))
            if not np.isnan(list(summed.values())).all():
                summed_scores = np.array([summed[s] for s in cell.steps])
                summed_metrics = old_precision_metrics(cell, summed_scores, cell.step_ceiling)
                summed_metrics["lift_chance_band"] = (cell.step_chance_band, cell.n)
                rows += cells._rows({**key, "level": "step_summed"}, summed_metrics)
        if token is not None:
            rows += old_token_metrics(cell, base, token)
    schema = {c: cells._dtype(c) for c in cells.COLUMNS}
    return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)


# --- Comparison and data ----------------------------------------------------------------------------------------


def compare(old: pl.DataFrame, new: pl.DataFrame) -> float:
    """Assert the tables agree (same rows and n; values to rtol 1e-9) and return the largest absolute difference."""
    old, new = old.sort(KEY), new.sort(KEY)
    assert old.select([*KEY, "n"]).equals(new.select([*KEY, "n"])), "the tables differ in their rows or n"
    worst = 0.0
    for column in ["value", "ci_low", "ci_high"]:
        a, b = old[column].to_numpy(), new[column].to_numpy()
        np.testing.assert_allclose(b, a, rtol=1e-9, equal_nan=True, err_msg=column)
        both = np.isfinite(a) & np.isfinite(b)
        worst = max(worst, float(np.abs(a - b)[both].max(initial=0.0)))
    return worst


def synthetic(n_steps=200, groups_per_step=32, size=8, n_sets=3, seed=0) -> dict:
    """Inputs of `evaluate` shaped like the default run: ~2% GT, scores with ties, 200 bootstrap replicates."""
    rng = np.random.default_rng(seed)
    n = n_steps * groups_per_step * size
    step = np.repeat(np.arange(n_steps), groups_per_step * size)
    boosted = rng.random(n) < 0.02
    rollouts = pl.DataFrame(
        {
            "rollout_id": np.arange(n),
            "step": step,
            "group_id": np.repeat(np.tile(np.arange(groups_per_step), n_steps), size),
            "boosted": boosted,
            "advantage": np.where(rng.random(n) < 0.1, 0.0, rng.normal(size=n)),
        }
    )
    fluency = rng.normal(size=n) + 0.3 * boosted
    scores = {}
    for k in range(n_sets):
        signal = rng.normal(size=n) + 0.5 * k * boosted
        # Rounded to ~19,000 levels (the real scores have ~16,000): many ties; one set tied within each step.
        roll = np.round(signal / 2, 4) if k < n_sets - 1 else np.repeat(rng.normal(size=n_steps), n // n_steps)
        frame = pl.DataFrame({"rollout_id": np.arange(n), "step": step, "score": roll})
        steps = frame.group_by("step").agg(pl.col("score").mean()).sort("step")
        steps = steps.with_columns(score_summed=pl.col("score") * 2 if k % 2 else pl.lit(float("nan")))
        scores[(f"estimator{k}", "none")] = (frame, steps)
    cos = rng.normal(0.1, 0.05, size=(2, n))
    cos[:, rng.random(n) < 0.3] = np.nan
    return dict(
        run="bench",
        seed=0,
        draw=0,
        rollouts=rollouts,
        fluency=fluency,
        probe_rate=np.repeat(np.linspace(0, 1, n_steps), n // n_steps),
        scores=scores,
        window=[40, 80],
        saturation=0.9,
        n_boot=200,
        eval_seed=0,
        fluency_match=0.1,
        token={"behavior": (cos[0], cos[1])},
    )


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def run_synthetic() -> None:
    args = synthetic()
    print(
        f"synthetic: {args['rollouts'].height} rollouts, {len(args['scores'])} score sets, {args['n_boot']} replicates"
    )
    old, t_old = timed(old_evaluate, **args)
    new, t_new = timed(cells.evaluate, **args)
    diff = compare(old, new)
    print(f"evaluate  old {t_old:7.2f} s   new {t_new:7.2f} s   old/new {t_old / t_new:5.1f}x   max |diff| {diff:.2e}")


def run_real(results: Path, config: Path, seed: int, draw: int) -> None:
    import yaml

    from behaviortrace.config.sections import Config
    from behaviortrace.evaluate import stage

    cfg = Config.from_dict(yaml.safe_load(config.read_text()))
    root = results / f"seed{seed}"
    score_files = {
        (path.parent.name, path.stem.removeprefix(f"draw{draw}_")): (path, path.with_name(f"{path.stem}_steps.parquet"))
        for path in sorted((root / "scores").glob(f"*/draw{draw}_*.parquet"))
        if not path.stem.endswith("_steps")
    }
    job = dict(
        seed=seed,
        draw=draw,
        shards=sorted((root / "sketch").glob("shard*.zarr")),
        rollouts=root / "rollouts.parquet",
        target_store=root / f"targets/draw{draw}.zarr",
        rates=root / f"targets/draw{draw}_rates.parquet",
        score_files=score_files,
    )
    print(f"{results} seed {seed} draw {draw}: {len(score_files)} score sets")
    tables, seconds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, evaluate in [("old", old_evaluate), ("new", cells.evaluate)]:
            inner = []

            def timed_evaluate(evaluate=evaluate, inner=inner, **kwargs):
                out, took = timed(evaluate, **kwargs)
                inner.append(took)
                return out

            out = Path(tmp) / f"{name}.parquet"
            with mock.patch.object(stage, "evaluate", timed_evaluate):
                _, took = timed(stage.evaluate_job, cfg, out=out, **job)
            tables[name], seconds[name] = pl.read_parquet(out), (took, inner[0])
    diff = compare(tables["old"], tables["new"])
    (job_old, ev_old), (job_new, ev_new) = seconds["old"], seconds["new"]
    print(f"evaluate_job  old {job_old:7.2f} s   new {job_new:7.2f} s   old/new {job_old / job_new:5.1f}x")
    print(f"  evaluate()  old {ev_old:7.2f} s   new {ev_new:7.2f} s   old/new {ev_old / ev_new:5.1f}x")
    print(f"{tables['new'].height} rows agree; max |diff| {diff:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", type=Path, help="a results directory (e.g. results/default) to run evaluate_job on")
    parser.add_argument("--config", type=Path, default=Path("config/config.yaml"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draw", type=int, default=0)
    args = parser.parse_args()
    if args.real:
        run_real(args.real, args.config, args.seed, args.draw)
    else:
        run_synthetic()


if __name__ == "__main__":
    main()
