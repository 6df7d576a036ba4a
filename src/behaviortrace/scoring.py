"""Run one estimator on one seed and target: one score per rollout and per step."""

from __future__ import annotations

import logging
import time

import numpy as np
import polars as pl

from . import estimators
from .seedview import SeedView, Target

log = logging.getLogger(__name__)
RESERVED = ("step_aggregate",)


def run_estimator(name: str, params: dict, view: SeedView, target: Target | None) -> tuple[pl.DataFrame, pl.DataFrame]:
    module = estimators.load(name)
    kwargs = {k: v for k, v in (params or {}).items() if k not in RESERVED}
    if module.USES_TARGET and target is None:
        raise ValueError(f"estimator {name} needs a target")
    started = time.time()
    scores = np.asarray(module.score(view, target, **kwargs), dtype=np.float64)
    if scores.shape != (view.rollouts.height,):
        raise ValueError(f"estimator {name} returned shape {scores.shape}, expected ({view.rollouts.height},)")
    if not np.isfinite(scores).all():
        raise ValueError(f"estimator {name} returned {int((~np.isfinite(scores)).sum())} non-finite scores")
    variant = module.step_score(view, target, **kwargs) if hasattr(module, "step_score") else None
    aggregate = (params or {}).get("step_aggregate", module.STEP_AGGREGATE)
    rollouts = pl.DataFrame({"rollout_id": view.rollouts["rollout_id"], "step": view.rollouts["step"], "score": scores})
    steps = estimators.step_table(view, scores, aggregate, variant)
    log.info("%s: %d rollouts and %d steps scored in %.1f s", name, rollouts.height, steps.height, time.time() - started)
    return rollouts, steps
