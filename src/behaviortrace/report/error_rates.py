"""How often each kind of checklist rule errs, by simulation at a run's own sizes, through the rules' own code
(report/verdicts.py): false pass under a null method, false FAIL under a method that truly meets the bar (at the
bar itself, where it is likeliest), and power at a stated effect.

Kinds: a threshold judged by intervals (the LDS items, the residualized AUC, the measured effect), a paired
comparison with a control (the beats items; beside it the unpaired non-overlap rule it replaced), Holm tests
against a null (the placebo's enrichment; its pass needs the AUC's interval within a margin of chance), and the
replay against step-matched random sets, and the dense endpoint's margins through its own statistic
(evaluate/dense.py), at fewer groups and resamples than a run's (each trial is a full two-stage bootstrap).
`diagnostics/checklist_error_rates.py` writes the table into
docs/evaluation.md; tests/test_error_rates.py asserts the rates.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

from behaviortrace.report import verdicts as V


@dataclass(frozen=True)
class Sizes:
    """A run's sizes: cells per method row of each kind, the family of method cells, bootstrap resamples, random
    replay repetitions."""

    threshold_cells: int = 12  # seeds x draws x subset sizes of an LDS item
    paired_cells: int = 6  # seeds x draws of a beats item
    placebo_cells: int = 2  # placebo seeds x draws (each an AUC and a step-lift test)
    replay_cells: int = 3  # seeds x removal sizes
    family: int = 500  # method tests of the whole checklist
    boot: int = 200
    repeats: int = 3  # random sets per replay cell
    alpha: float = 0.05
    dense_seeds: int = 3  # planted seeds the dense endpoint pools
    dense_groups: int = 40  # prompt groups per seed (the default run has 320: its power is higher than simulated)
    dense_boot: int = 200  # bootstrap resamples (the default run draws 1000)

    @property
    def z(self) -> float:
        return V.Family(self.alpha, self.family).z


def _verdicts(passes: np.ndarray, fails: np.ndarray) -> np.ndarray:
    """Row verdicts of trials x cells outcomes."""
    return np.where(fails.any(axis=1), V.FAIL, np.where(passes.all(axis=1), V.PASS, V.INCONCLUSIVE))


def threshold(sizes: Sizes, theta, trials: int, rng, limit: float = 0.5, se: float = 0.05) -> np.ndarray:
    """Row verdicts of a method whose true value is `theta` in every cell (or one per cell), each cell's estimate
    normal with a 95% interval of +-1.96 se."""
    value = theta + se * rng.standard_normal((trials, sizes.threshold_cells))
    low, high = value - V.Z95 * se, value + V.Z95 * se
    passes = low >= limit
    fails = V.widened_high(value, high, sizes.z) < limit
    return _verdicts(passes, fails)


def _replicates(rng, shape, boot, value, sd, shared, rho):
    """Element 0 the cell's estimate around the true `value`; the rest its bootstrap replicates, spread as the
    estimate is but around the estimate itself (as resampling the cell's own data is)."""
    own = rng.standard_normal((*shape, boot + 1))
    draws = value + sd * (rho * shared + np.sqrt(1 - rho**2) * own)
    draws[..., 1:] += draws[..., :1] - value
    return draws


def paired(sizes: Sizes, delta, trials: int, rng, sd: float = 0.03, rho: float = 0.9) -> tuple:
    """Row verdicts of a method `delta` above a control in every cell, their bootstrap replicates sharing the
    cell's resamples (correlation `rho`; element 0 is the point estimate): by the paired rule, and by the
    non-overlap of the two intervals it replaced."""
    shape = (trials, sizes.paired_cells)
    shared = rng.standard_normal((*shape, sizes.boot + 1))
    delta = np.broadcast_to(np.asarray(delta, float), (sizes.paired_cells,))[:, None]  # one per cell
    est = _replicates(rng, shape, sizes.boot, 0.7 + delta, sd, shared, rho)
    ctl = _replicates(rng, shape, sizes.boot, 0.7, sd, shared, rho)
    diff = est - ctl
    low, high = np.percentile(diff[..., 1:], [2.5, 97.5], axis=-1)
    point = diff[..., 0]
    paired_verdicts = _verdicts(low > 0, V.widened_high(point, high, sizes.z) < 0)
    e_low, e_high = np.percentile(est[..., 1:], [2.5, 97.5], axis=-1)
    c_low, c_high = np.percentile(ctl[..., 1:], [2.5, 97.5], axis=-1)
    unpaired_verdicts = _verdicts(e_low > c_high, e_high < c_low)
    return paired_verdicts, unpaired_verdicts


def placebo(sizes: Sizes, auc, trials: int, rng, gap: float = 0.1, se: float = 0.03) -> np.ndarray:
    """Row verdicts of the placebo item for a method whose true behavior-matched AUC is `auc`: pass where every
    interval lies within 0.5 +- gap, FAIL where Holm over the row's one-sided tests (AUC and step lift per cell)
    rejects at the row's share of the family-wise error."""
    cells = sizes.placebo_cells
    auc = np.broadcast_to(np.asarray(auc, float), (cells,))  # one per cell
    value = auc + se * rng.standard_normal((trials, cells))
    within = (value - V.Z95 * se >= 0.5 - gap) & (value + V.Z95 * se <= 0.5 + gap)
    sf = np.vectorize(lambda z: 1 - NormalDist().cdf(z))
    p_auc = sf((value - 0.5) / se)
    p_step = sf((auc - 0.5) / se + rng.standard_normal((trials, cells)))  # a second, noisier test of the same shift
    budget = V.Family(sizes.alpha, sizes.family).budget(2 * cells)
    out = []
    for a, b, w in zip(p_auc, p_step, within, strict=True):
        rejected = any(V.null_rejected([*a, *b], budget))
        out.append(V.FAIL if rejected else V.PASS if w.all() else V.INCONCLUSIVE)
    return np.array(out)


def replay(sizes: Sizes, shift, trials: int, rng) -> np.ndarray:
    """Row verdicts of a set whose change is `shift` (in sd of the random sets) below its step-matched random
    sets' in every cell."""
    budget = V.Family(sizes.alpha, sizes.family).budget(sizes.replay_cells)
    shift = np.broadcast_to(np.asarray(shift, float), (sizes.replay_cells,))  # one per cell
    out = []
    for _ in range(trials):
        cells = []
        for c in range(sizes.replay_cells):
            randoms = rng.standard_normal(sizes.repeats)
            change = rng.standard_normal() - shift[c]
            cells.append((change, randoms.min(), randoms.max(), sizes.repeats))
        below, fails, _ = V.beats_random(cells, budget)
        out.append(V.three(below, [fails]))
    return np.array(out)


GROUP_SIZE = 8  # rollouts per prompt group in the dense simulation
# Training noise: the sd across seeds of the log of each score's noise scale (a margin sd of about 0.02 between
# seeds, a few times the default run's).
SEED_SD = 0.05


def _noise_for(rho: float) -> float:
    """The sd of normal noise added to I (sd 1) that leaves a Spearman correlation of `rho` with it (for a
    bivariate normal, rho = 6 / pi * arcsin(r / 2))."""
    r = 2 * np.sin(np.pi * rho / 6)
    return float(np.sqrt(1 / r**2 - 1))


def dense(sizes: Sizes, delta: float, trials: int, rng, control: float = 0.45) -> np.ndarray:
    """Row verdicts of a `beats_log_only` item through its real statistic (evaluate/dense.py: the pooled Spearman,
    the two-stage bootstrap over seeds and groups, the margin over the strongest of two log-only controls in each
    resample, the margin over random) for a method whose agreement with I is `delta` above the stronger control's
    (`control`, the default run's behavior_advantage), at the run's seeds, groups and resamples. I has a group
    effect (half its variance), and each seed draws its own noise scales (training noise between seeds)."""
    from behaviortrace.evaluate.dense import DenseSeed
    from behaviortrace.evaluate.dense import dense as pooled

    noise = {"method": _noise_for(control + delta), "strong": _noise_for(control), "weak": _noise_for(control / 2)}
    out = []
    for _ in range(trials):
        seeds = []
        for s in range(sizes.dense_seeds):
            groups = np.repeat(np.arange(sizes.dense_groups), GROUP_SIZE)
            infl = np.sqrt(0.5) * (rng.standard_normal(sizes.dense_groups)[groups] + rng.standard_normal(groups.size))
            scores = {
                (None, name, "none"): infl
                + sd * np.exp(SEED_SD * rng.standard_normal()) * rng.standard_normal(infl.size)
                for name, sd in noise.items()
            }
            scores[(None, "random", "none")] = rng.standard_normal(infl.size)
            seeds.append(DenseSeed(s, groups, infl, scores))
        rows = pooled(seeds, "rollout_dense", ("strong", "weak"), sizes.dense_boot, int(rng.integers(2**31)))
        (row,) = [r for r in rows if r["estimator"] == "method"]
        margins = [(row[m], row[f"{m}_low"], row[f"{m}_high"]) for m in ("over_log_only", "over_random")]
        passes, fails = V.margins_above(margins, sizes.z)
        out.append(V.three([passes], [fails]))
    return np.array(out)


def family_fail(sizes: Sizes, trials: int, rng, se: float = 0.05) -> float:
    """How often any of the checklist's method tests FAILs when every one sits exactly at its bar."""
    value = se * rng.standard_normal((trials, sizes.family))
    return float((V.widened_high(value, value + V.Z95 * se, sizes.z) < 0).any(axis=1).mean())


def _rate(verdicts: np.ndarray, verdict: str) -> float:
    return float((verdicts == verdict).mean()) if len(verdicts) else float("nan")


def worst(cells: int, at: float, far: float) -> np.ndarray:
    """The least favourable null for a pass that needs every cell: one cell at the bar, every other far past it
    (a pass then hangs on that one cell's test alone)."""
    return np.array([at] + [far] * (cells - 1))


def rates(sizes: Sizes, trials: int = 2000, seed: int = 0) -> list[dict]:
    """Per kind: false pass at the least favourable null (`worst`), false FAIL with every cell at its bar, power,
    and the effect power is stated at."""
    rng = np.random.default_rng(seed)
    se, delta, gap = 0.05, 0.08, 0.1
    null = threshold(sizes, worst(sizes.threshold_cells, 0.5, 1.5), trials, rng, se=se)
    meets = threshold(sizes, 0.5, trials, rng, se=se)
    power = threshold(sizes, 0.5 + 4 * se, trials, rng, se=se)
    zero, _ = paired(sizes, worst(sizes.paired_cells, 0.0, 1.0), trials, rng)
    at_bar, _ = paired(sizes, 0.0, trials, rng)
    effect, unpaired = paired(sizes, delta, trials, rng)
    enriched = placebo(sizes, worst(sizes.placebo_cells, 0.5 + gap, 0.5), trials, rng, gap)
    chance = placebo(sizes, 0.5, trials, rng, gap)
    strong = placebo(sizes, 0.75, trials, rng, gap)
    exchangeable = replay(sizes, worst(sizes.replay_cells, 0.0, 20.0), trials // 4, rng)
    no_better, better = replay(sizes, 0.0, trials // 4, rng), replay(sizes, 3.0, trials // 4, rng)
    kinds = [
        ("threshold with interval (LDS, residualized AUC, effect)", sizes.threshold_cells, null, meets, power, V.PASS,
         "true value 4 se above the bar, in every cell"),
        ("paired comparison with a control (beats items)", sizes.paired_cells, zero, at_bar, effect, V.PASS,
         f"{delta} above the control (AUC sd 0.03, resamples correlated 0.9); the non-overlap rule it replaced: "
         f"{_rate(unpaired, V.PASS):.3f}"),
        ("Holm tests against a null, pass by equivalence (placebo)", sizes.placebo_cells, enriched, chance, strong,
         V.FAIL, f"AUC 0.75 found (FAIL); an estimator at chance passes {_rate(chance, V.PASS):.3f}"),
        ("replay against step-matched random sets", sizes.replay_cells, exchangeable, no_better, better, V.PASS,
         "3 sd of the random sets below them"),
    ]  # fmt: skip
    dense_trials, dense_delta = max(trials // 20, 1), 0.2  # 0.2: the gap of the default run's methods
    at_bar, above = dense(sizes, 0.0, dense_trials, rng), dense(sizes, dense_delta, dense_trials, rng)
    kinds.append(("dense endpoint's margins (beats_log_only items)", 1, at_bar, at_bar, above, V.PASS,
                  f"agreement with I {dense_delta} above the strongest log-only control's (0.45), over "
                  f"{sizes.dense_seeds} seeds x {sizes.dense_groups} groups of {GROUP_SIZE}, seed noise "
                  f"{SEED_SD}; {dense_trials} trials"))  # fmt: skip
    anywhere = family_fail(sizes, trials, rng, se)
    kinds.append(("every method test of the checklist at its bar (family-wise)", sizes.family, null[:0], null[:0],
                  null[:0], V.PASS, f"any FAIL: {anywhere:.3f} (alpha {sizes.alpha})"))  # fmt: skip
    return [
        {"kind": kind, "cells": cells, "false_pass": _rate(no, V.PASS), "false_fail": _rate(yes, V.FAIL),
         "power": _rate(pw, verdict), "effect": effect}
        for kind, cells, no, yes, pw, verdict, effect in kinds
    ]  # fmt: skip


def markdown(sizes: Sizes, rows: list[dict], trials: int, seed: int) -> str:
    head = (
        "| kind | cells per row | false pass (least favourable null) | false FAIL (at the bar) | power | effect |\n"
        "|---|---|---|---|---|---|"
    )

    def cell(x: float) -> str:
        return "–" if x != x else f"{x:.3f}"

    lines = [
        f"| {r['kind']} | {r['cells']} | {cell(r['false_pass'])} | {cell(r['false_fail'])} | {cell(r['power'])} | "
        f"{r['effect']} |"
        for r in rows
    ]
    given = ", ".join(f"{k} {v}" for k, v in asdict(sizes).items())
    return (
        f"Sizes: {given}; {trials} trials, seed {seed} (`python diagnostics/checklist_error_rates.py`).\n\n"
        + head
        + "\n"
        + "\n".join(lines)
        + "\n"
    )
