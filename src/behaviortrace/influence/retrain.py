"""Real retraining with rollout weights, for the checks and the LDS: f(w_T) after replaying the steps from a
saved state with some rollouts' weights changed (0: the rollout removed), under either meaning of a weight
(trajectory.py: through the advantages, or held).

Finite differences run in float64 end to end (a model loaded in float64 computes in float64 throughout:
model/precision.py), on a float64 copy of the trajectory that starts from the float32 states of the influence's
own forward sweep.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from behaviortrace.influence.trajectory import State, Trajectory


def value_after(
    traj: Trajectory, start: State, weights: dict[int, float], end: int, objective, semantics: str | None = None
) -> float:
    """f(w_end) after replaying from `start` with the rollout `weights` (rollout id -> weight), under `semantics`
    (the trajectory's by default)."""
    traj.restore(start)
    traj.run(end, weights, semantics=semantics)
    return objective.value(traj.model)


def central_difference(
    traj64: Trajectory,
    start: State,
    rollout_ids: int | Iterable[int],
    delta: float,
    end: int,
    objective,
    semantics: str | None = None,
) -> tuple[float, float]:
    """(f(+delta) - f(-delta)) / (2 delta) with the weights of `rollout_ids` (one rollout, or a set scaled
    together: a group) at 1 +- delta, and the mean of the two values; `traj64` is a float64 trajectory, `start`
    any state before the rollouts' step."""
    ids = [rollout_ids] if isinstance(rollout_ids, int) else list(rollout_ids)
    start64 = start.to(torch.float64)
    up = value_after(traj64, start64, dict.fromkeys(ids, 1 + delta), end, objective, semantics)
    down = value_after(traj64, start64, dict.fromkeys(ids, 1 - delta), end, objective, semantics)
    return (up - down) / (2 * delta), (up + down) / 2
