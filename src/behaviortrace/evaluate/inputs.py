"""What the evaluation reads besides the scores: each row's probe behavior rate, and the cosines of
behavior-token (and null-position) sketches with the targets."""

from __future__ import annotations

import numpy as np
import polars as pl

from behaviortrace.score.vectors import target_cosine
from behaviortrace.score.view import SeedView, Target


def probe_rate_per_row(view: SeedView, rates: pl.DataFrame) -> np.ndarray:
    """This draw's probe behavior rate at the analysis checkpoint that stands for each row's checkpoint."""
    probes = rates.filter(pl.col("prompt_set") == "probes").sort("step")
    steps = probes["step"].to_numpy()
    idx = np.searchsorted(steps, view.rollouts["checkpoint_step"].to_numpy(), side="right") - 1
    return probes["behavior_rate"].to_numpy()[idx]


def token_cosines(view: SeedView, targets: dict[str, Target]) -> dict:
    """Per target kind: cosines of behavior-token and of null-position sketches with the target.

    The sketches are loss gradients, -advantage x the log-prob gradient (plus the KL term), so each
    cosine is multiplied by the sign of the advantage: it then compares the direction in which the
    rollout's marker tokens (or null positions) were made more likely with the target. Rollouts with
    zero advantage carry no such direction and are left out.
    """
    has_marker, null_norm = view.array("has_marker"), view.array("null_norm")
    sign = np.sign(view.rollouts["advantage"].to_numpy())
    out = {}
    for kind, target in targets.items():
        idx, has = target.for_rows(view)
        usable = has & (sign != 0)
        # Minus the loss gradient's cosine: the direction the tokens were made more likely.
        behavior = np.where(
            usable & has_marker, -sign * target_cosine(view.array("behavior_sketch"), target, idx), np.nan
        )
        null = np.where(usable & (null_norm > 0), -sign * target_cosine(view.array("null_sketch"), target, idx), np.nan)
        out[kind] = (behavior, null)
    return out
