"""Attribution estimators and target-free controls, one module per estimator.

An estimator is a module in this package named after it, with

    USES_TARGET: bool                 # False for controls that use no target
    STEP_AGGREGATE: str               # how rollout scores make a step score: sum, mean or max
    def score(view, target, **params) -> np.ndarray          # one score per rollout, in view order
    def step_score(view, target, **params) -> np.ndarray     # optional: a step-level variant, per step

`view` is a read-only SeedView, `target` a Target (None when USES_TARGET is False), `params` the
estimator's entry in the config. Higher scores mean "more likely taught the behavior". Adding an
estimator is one new module here and one entry under `estimators:` in the config; a digest of each
module is a parameter of its own score jobs only, so editing it reruns nothing else.
"""

from __future__ import annotations

import hashlib
import importlib
import pkgutil
from pathlib import Path

import numpy as np
import polars as pl

AGGREGATES = ("sum", "mean", "max")


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if not m.name.startswith("_"))


def load(name: str):
    if name not in available():
        raise ValueError(f"unknown estimator {name!r}; available: {', '.join(available())} "
                         f"(add one as src/behaviortrace/estimators/{name}.py)")
    module = importlib.import_module(f"{__name__}.{name}")
    for attr in ("USES_TARGET", "STEP_AGGREGATE", "score"):
        if not hasattr(module, attr):
            raise TypeError(f"estimator module {module.__name__} lacks {attr}")
    return module


def module_path(name: str) -> Path:
    return Path(__file__).parent / f"{name}.py"


def source_digest(name: str) -> str:
    """A digest of the estimator's module source, so that editing it reruns its score jobs."""
    return hashlib.sha256(module_path(name).read_bytes()).hexdigest()[:16]


def step_table(view, rollout_scores: np.ndarray, aggregate: str, variant: np.ndarray | None) -> pl.DataFrame:
    """Step-level scores: the aggregate of the step's rollout scores, and the step-level variant if any."""
    if aggregate not in AGGREGATES:
        raise ValueError(f"step_aggregate {aggregate!r} is not one of {AGGREGATES}")
    df = pl.DataFrame({"step": view.rollouts["step"], "score": rollout_scores})
    agg = {"sum": pl.col("score").sum(), "mean": pl.col("score").mean(), "max": pl.col("score").max()}[aggregate]
    out = df.group_by("step").agg(agg.alias("score")).sort("step")
    steps = out["step"].to_numpy()
    summed = np.full(len(steps), np.nan) if variant is None else np.asarray(variant, dtype=float)
    if len(summed) != len(steps):
        raise ValueError(f"step-level variant gave {len(summed)} scores for {len(steps)} steps")
    return out.with_columns(score_summed=pl.Series(summed))


def step_sums(view, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step (ascending), the sum of the step's rows of `vectors`, and the row index of each step's first row."""
    steps = view.rollouts["step"].to_numpy()
    uniq, first = np.unique(steps, return_index=True)
    order = np.argsort(steps, kind="stable")
    starts = np.searchsorted(steps[order], uniq)
    return np.add.reduceat(vectors[order], starts, axis=0).astype(np.float64), first


def target_inner(matrix: np.ndarray, target, idx: np.ndarray) -> np.ndarray:
    """<matrix row i, target vector idx[i]> for every row, as one matrix product with the few targets."""
    return (matrix @ target.vectors.T.astype(matrix.dtype))[np.arange(len(idx)), idx].astype(np.float64)


def target_cosine(matrix: np.ndarray, target, idx: np.ndarray) -> np.ndarray:
    """Cosine of each row with its target vector; 0 where either is zero."""
    norms = np.linalg.norm(matrix, axis=1).astype(np.float64)
    t_norms = np.linalg.norm(target.vectors, axis=1).astype(np.float64)[idx]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.nan_to_num(target_inner(matrix, target, idx) / (norms * t_norms), nan=0.0, posinf=0.0, neginf=0.0)
