"""The reverse sweep: I_z for every rollout of the steps before T, by reverse mode through the replayed training,
under both meanings of a rollout's weight at once (through the advantages, and held; adjoint.py).

The forward sweep replays steps 0..T-1 and saves the training state at the start of every segment of
`segment` steps (on disk); the last segment's states stay in memory. The backward sweep walks the
segments from the last to the first: it recomputes a segment's states from its saved start, then steps
the adjoint back through each of its steps (adjoint.py). So with P trainable parameters, T steps and
segment length M:

- time: T forward steps, every segment but the last recomputed (M floor((T - 1) / M) steps, none when M >= T),
  and T double-backward steps (about three forward-backward passes each);
- memory: the model, its optimizer, the adjoint (3P) and M states (3P each) at once; disk: the ceil(T / M)
  segment starts (3P each). M near sqrt(T) keeps both small; the default run holds every state (M >= T).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from behaviortrace.influence.adjoint import CHANNELS, Adjoint, step_back
from behaviortrace.influence.trajectory import State, Trajectory

log = logging.getLogger(__name__)


class StateStore:
    """Training states saved on disk by step, in a folder the caller owns (the job's temporary folder)."""

    def __init__(self, folder: Path, device):
        self.folder, self.device = Path(folder), device
        self.folder.mkdir(parents=True, exist_ok=True)
        self.steps: set[int] = set()

    def save(self, state: State) -> None:
        state.save(self.folder / f"state{state.step:06d}.pt")
        self.steps.add(state.step)

    def load(self, step: int) -> State:
        return State.load(self.folder / f"state{step:06d}.pt", self.device)

    def nearest(self, step: int) -> State:
        """The saved state closest before (or at) `step`."""
        return self.load(max(s for s in self.steps if s <= step))


@dataclass
class Influence:
    """d f(w_T) / d u_z of every rollout of the steps before T (rollout ids, steps), per channel (adjoint.CHANNELS),
    f(w_T), the gradient norms and timings. `advantages` is I_z through the advantages (the channels' sum), `held`
    I_z with advantages and normalization held, `influence` the one of `semantics`."""

    rollout_ids: np.ndarray
    steps: np.ndarray
    channels: dict[str, np.ndarray]
    semantics: str
    f_end: float
    grad_norms: list[float]
    seconds: dict = field(default_factory=dict)

    @property
    def held(self) -> np.ndarray:
        return self.channels["held"]

    @property
    def advantages(self) -> np.ndarray:
        return sum(self.channels[name] for name in CHANNELS)

    def of(self, semantics: str) -> np.ndarray:
        return self.held if semantics == "held" else self.advantages

    @property
    def influence(self) -> np.ndarray:
        return self.of(self.semantics)

    def table(self, channels: bool = True):
        """One row per rollout: its id and step, I under the run's semantics, through the advantages and held, and
        with `channels` each channel of the advantages' I (`via_*`)."""
        import polars as pl

        parts = {f"via_{name}": self.channels[name] for name in CHANNELS if name != "held"} if channels else {}
        return pl.DataFrame(
            {
                "rollout_id": self.rollout_ids,
                "step": self.steps,
                "influence": self.influence,
                "influence_advantages": self.advantages,
                "influence_held": self.held,
                **parts,
            }
        )


def segment_starts(end: int, segment: int) -> list[int]:
    return list(range(0, end, segment))


def exact_influence(
    traj: Trajectory, objective, end: int, segment: int, store: StateStore, keep=(), on_step=None
) -> Influence:
    """I_z = d objective(w_end) / d u_z for the rollouts of steps 0..end-1, starting from `traj` at step 0.

    `objective` has `value(model)` and `gradient(model)` (by parameter name). The state before every
    segment start and every step in `keep` is saved in `store` (and stays there, for retraining from it).
    `on_step(step_done, traj)` runs after every step of the forward sweep (the checkpoint comparison).
    """
    if traj.done != 0:
        raise ValueError("the exact influence starts from step 0")
    segment = max(1, segment)
    # Wall-clock seconds, and CPU seconds beside them (`_cpu`): a shared machine's load stretches the first only.
    seconds, started, checking = {}, time.time(), 0.0
    cpu_started, cpu_checking = time.process_time(), 0.0
    starts = segment_starts(end, segment)
    last: list[State] = []
    grad_norms = []
    for step in range(end):
        if step in starts or step in keep:
            store.save(traj.state())
        if step >= starts[-1]:
            last.append(traj.state())
        grad_norms.append(traj.step())
        if on_step is not None:
            t0, c0 = time.time(), time.process_time()
            on_step(traj.done, traj)
            checking += time.time() - t0
            cpu_checking += time.process_time() - c0
        if (step + 1) % 10 == 0 or step + 1 == end:
            log.info("forward: step %d/%d; %.1f s", step + 1, end, time.time() - started)
    seconds["forward"] = time.time() - started - checking  # the replay alone, without `on_step`'s checks
    seconds["forward_cpu"] = time.process_time() - cpu_started - cpu_checking
    seconds["forward_checks"] = checking
    f_end = objective.value(traj.model)
    grad_f = objective.gradient(traj.model)
    adj = Adjoint.at_end([grad_f[name].to(traj.dtype) for name in traj.names])

    started, recompute = time.time(), 0.0
    cpu_started, cpu_recompute = time.process_time(), 0.0
    found: dict[int, dict[str, np.ndarray]] = {}
    for first in reversed(starts):
        if first == starts[-1]:
            states = last
        else:
            t0, c0 = time.time(), time.process_time()
            traj.restore(store.load(first))
            states = []
            for _ in range(first, min(first + segment, end)):
                states.append(traj.state())
                traj.step()
            recompute += time.time() - t0
            cpu_recompute += time.process_time() - c0
        for state in reversed(states):
            adj, found[state.step] = step_back(traj, state, adj)
            done = end - state.step
            if done % 10 == 0 or state.step == 0:
                log.info("backward: %d/%d steps; %.1f s", done, end, time.time() - started)
        states.clear()
    seconds["recompute"] = recompute
    seconds["backward"] = time.time() - started - recompute
    seconds["recompute_cpu"] = cpu_recompute
    seconds["backward_cpu"] = time.process_time() - cpu_started - cpu_recompute
    ids, steps = [], []
    channels = {name: [] for name in CHANNELS}
    for step in range(end):
        every = traj.rows(step).every
        ids.append(every)
        steps.append(np.full(len(every), step))
        for name in CHANNELS:
            channels[name].append(found[step][name])
    return Influence(
        np.concatenate(ids),
        np.concatenate(steps),
        {name: np.concatenate(v) for name, v in channels.items()},
        traj.semantics,
        f_end,
        grad_norms,
        seconds,
    )
