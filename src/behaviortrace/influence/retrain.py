"""Real retraining with rollout weights, for the checks and the LDS: f(w_T) after replaying the steps from a
saved state with some rollouts' weights changed (0: the rollout removed), under either meaning of a weight
(trajectory.py: through the advantages, or held).

Finite differences run in float64 end to end (a model loaded in float64 computes in float64 throughout:
model/precision.py), on a float64 copy of the trajectory that starts from the float32 states of the influence's
own forward sweep.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import torch

from behaviortrace.influence.sets import SEMANTICS, Zeroed
from behaviortrace.influence.trajectory import State, Trajectory

log = logging.getLogger(__name__)


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


def first_steps(traj, sets: list[Zeroed], end: int) -> list[int]:
    """Each set's first step holding a removed rollout (`end` where none is before it): training up to that step is
    training as logged, the forward sweep's own states."""
    step_of = {int(z): step for (step,), rows in traj.by_step.items() for z in rows["rollout_id"]}
    return [min((step_of[z] for z in s.removed if step_of.get(z, end) < end), default=end) for s in sets]


def retrain(traj, store, sets: list[Zeroed], end: int, objective, batch: int) -> list[float]:
    """f(w_end) with each set removed under its semantics. Training is as logged until a set's first removed
    rollout, so a set restarts from the forward sweep's saved state nearest before that step (bit for bit the
    retraining from step 0: a step without a weight changed runs the sweep's own code); `batch` sets of one
    semantics go together (batched.py), from the earliest first step among them."""
    from behaviortrace.influence.batched import values_after
    from behaviortrace.influence.retrain import value_after

    values, done, started = [0.0] * len(sets), 0, time.time()
    firsts = first_steps(traj, sets, end)
    chunks = []
    for semantics in SEMANTICS:
        of = sorted((i for i, z in enumerate(sets) if z.semantics == semantics), key=lambda i: firsts[i])
        chunks += [of[i : i + batch] for i in range(0, len(of), batch)]
    start_step, start = None, None  # the last state read: chunks sorted by first step mostly reuse it
    for chunk in chunks:
        first = min(firsts[i] for i in chunk)
        if first != start_step:
            start_step, start = first, store.nearest(first)  # restore() copies from it, so it stays as saved
        semantics = sets[chunk[0]].semantics
        weights = [dict.fromkeys(sets[i].removed, 0.0) for i in chunk]
        if len(chunk) == 1:
            found = [value_after(traj, start, weights[0], end, objective, semantics)]
        else:
            found = values_after(traj, start, weights, end, objective, semantics)
        for i, value in zip(chunk, found, strict=True):
            values[i], z, done = value, sets[i], done + 1
            log.info(
                "retrained %d/%d, %s %s %s #%d (%d removed, %s): f(w_%d) = %.6f; %.1f s",
                done,
                len(sets),
                z.kind,
                z.level,
                f"{z.percent}%",
                z.index,
                len(z.removed),
                z.semantics,
                end,
                value,
                time.time() - started,
            )
    return values
