"""What the evaluation reads besides the scores: each row's probe behavior rate, and the cosines of
behavior-token (and null-position) sketches with the targets."""

from __future__ import annotations

import numpy as np
import polars as pl

from behaviortrace.common.vectors import target_cosine
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


def token_cosine_table(view: SeedView, targets: dict[str, Target]) -> pl.DataFrame:
    """`token_cosines` as a table in view order: rollout_id, then {kind}_behavior and {kind}_null."""
    columns = {"rollout_id": view.rollouts["rollout_id"]}
    for kind, (behavior, null) in token_cosines(view, targets).items():
        columns[f"{kind}_behavior"], columns[f"{kind}_null"] = behavior, null
    return pl.DataFrame(columns)


def token_cosines_from_table(table: pl.DataFrame, view: SeedView) -> dict:
    """The table written by `token_cosine_table`, back in the form `evaluate` takes, checked against the view."""
    if not table["rollout_id"].equals(view.rollouts["rollout_id"]):
        raise ValueError("token cosine table rows do not match the seed's sketch rows; rerun its token_cosines job")
    kinds = [c.removesuffix("_behavior") for c in table.columns if c.endswith("_behavior")]
    return {kind: (table[f"{kind}_behavior"].to_numpy(), table[f"{kind}_null"].to_numpy()) for kind in kinds}
