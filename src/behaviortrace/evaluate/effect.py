"""Effect-based evaluation: do an estimator's step scores track what each step measurably did to the
behavior? The measured change of step t is f(w_{t+1}) - f(w_t), with f the forced target's mean log-prob
on the probe prompts (train/effect.py, in the step log). Labels say which rollouts were paid for the
behavior; this says which steps moved it, whatever the label.

Per estimator and target, over the steps of a stratum: Pearson and Spearman correlation of the step score
(the aggregate of its rollout scores) with the measured change, the Spearman correlation given the step number
(both can decay over training: a shared trend alone would make them agree) and, for estimators whose step scores are
first-order predictions of that change in its own units (`PREDICTS_CHANGE`, scored against the forced
target, the function measured), the share of the total change they account for: sum of scores / sum of
changes. Intervals: a circular block bootstrap over steps (`block_resamples`; resamples shared by every
estimator of a cell). The
`label` row correlates the number of labeled rollouts in each step with the change: where it is
low, the planted label and the measured effect disagree about which steps taught the behavior.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from behaviortrace.evaluate.correlation import partial_spearman, pearson, spearman

EFFECT_STRATA = ("all", "window", "after_window")
MEASURED_TARGET = "forced"


def measured_changes(step_log: pl.DataFrame) -> pl.DataFrame:
    """step, change: the measured change of every step (the step log of train/effect.py), checked."""
    if "target_change" not in step_log.columns:
        raise ValueError("the step log has no target_change column: it was written before effect measurement; retrain")
    out = step_log.select("step", pl.col("target_change").alias("change")).sort("step")
    if out["change"].is_nan().any() or out["change"].is_null().any():
        raise ValueError("the step log has steps without a measured change (training ran without probe prompts)")
    return out


def block_resamples(n: int, n_boot: int, seed: int) -> np.ndarray:
    """[n_boot, n] step indices of a circular block bootstrap with blocks of ceil(sqrt(n)) consecutive steps:
    neighbouring steps are correlated (momentum, saturation), so resampling single steps would understate
    the uncertainty."""
    length = int(np.ceil(np.sqrt(n)))
    blocks = int(np.ceil(n / length))
    starts = np.random.default_rng(seed).integers(0, n, size=(n_boot, blocks))
    return ((starts[..., None] + np.arange(length)) % n).reshape(n_boot, blocks * length)[:, :n]


class EffectCell:
    """The steps of one stratum with their measured change, and the bootstrap resamples of those steps."""

    def __init__(self, changes: pl.DataFrame, steps: np.ndarray, n_boot: int, seed: int):
        table = changes.filter(pl.col("step").is_in(steps.tolist()))
        self.steps = table["step"].to_numpy()
        self.change = table["change"].to_numpy()
        n = len(self.steps)
        self.draws = np.vstack([np.arange(n)[None], block_resamples(n, n_boot, seed)]) if n else None

    def metrics(self, step_scores: pl.DataFrame, with_share: bool) -> dict[str, tuple[np.ndarray, int]]:
        """{metric: (point estimate then bootstrap replicates, steps)} for one set of step scores."""
        if self.draws is None:
            return {}
        scores = dict(zip(step_scores["step"].to_list(), step_scores["score"].to_list(), strict=True))
        missing = [int(s) for s in self.steps if s not in scores]
        if missing:
            raise ValueError(f"step scores lack steps {missing[:5]}")
        s = np.array([scores[int(t)] for t in self.steps], dtype=np.float64)[self.draws]
        d = self.change[self.draws]
        out = {
            "effect_pearson": (pearson(s, d), len(self.steps)),
            "effect_spearman": (spearman(s, d), len(self.steps)),
            "effect_spearman_given_step": (partial_spearman(s, d, self.steps[self.draws]), len(self.steps)),
        }
        if with_share:
            with np.errstate(invalid="ignore", divide="ignore"):
                out["effect_share"] = (s.sum(-1) / d.sum(-1), len(self.steps))
        return out


def label_per_step(rollouts: pl.DataFrame) -> pl.DataFrame:
    """step, score: the number of labeled rollouts of each step (the label's own step ranking)."""
    return rollouts.group_by("step").agg(pl.col("label").cast(pl.Float64).sum().alias("score")).sort("step")
