"""Real retraining with rollout shares scaled, for the checks and the LDS: f(w_T) after replaying the steps
from a saved state with some rollouts' loss terms weighted (0 zeroes a share; advantages stay as logged).

Finite differences run in float64 end to end (a model loaded in float64 computes in float64 throughout:
model/precision.py), on a float64 copy of the trajectory that starts from the float32 states of the influence's
own forward sweep.
"""

from __future__ import annotations

import torch

from behaviortrace.influence.trajectory import State, Trajectory


def value_after(traj: Trajectory, start: State, weights: dict[int, float], end: int, objective) -> float:
    """f(w_end) after replaying from `start` with the rollout `weights` (rollout id -> loss multiplier)."""
    traj.restore(start)
    traj.run(end, weights)
    return objective.value(traj.model)


def central_difference(
    traj64: Trajectory, start: State, rollout_id: int, delta: float, end: int, objective
) -> tuple[float, float]:
    """(f(+delta) - f(-delta)) / (2 delta) with rollout `rollout_id`'s share scaled by 1 +- delta, and the
    mean of the two values; `traj64` is a float64 trajectory, `start` any state before the rollout's step."""
    start64 = start.to(torch.float64)
    up = value_after(traj64, start64, {rollout_id: 1 + delta}, end, objective)
    down = value_after(traj64, start64, {rollout_id: 1 - delta}, end, objective)
    return (up - down) / (2 * delta), (up + down) / 2
