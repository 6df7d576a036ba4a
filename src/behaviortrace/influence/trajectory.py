"""The replayed training of one seed with every rollout's share of the loss weighted: the forward pass of
the exact influence, and the retraining its checks compare against.

Each step repeats what TRL did (trl 1.16, on-policy, one optimizer step per generation batch), by the same
code path as the leave-out replay (replay/retrain.py): the step's rollouts padded as TRL padded the whole
batch, TRL's per-rollout loss and normalization (train/trl_surface.py), gradient clipping, and the AdamW
optimizer and schedule transformers' Trainer builds. Unlike the leave-out replay, the advantages are the
logged ones and never recomputed: rollout z's term is multiplied by a weight (1 + eps_z), and a weight of
0 zeroes its share while every other rollout keeps its advantage and the step keeps its normalization.

A `State` is everything a step depends on besides the logged data (weights, AdamW's moments and update
count, the learning rate), so that training can be restarted from any saved step.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from behaviortrace.config.sections import Grpo
from behaviortrace.gradients.batch import batch_to, completion_logps, step_batch
from behaviortrace.train.trl_surface import optimizer_and_schedule, rollout_losses


@dataclass
class StepRows:
    """The rollouts of one step that go through the model, as TRL's padded batch, and the step's normalization.

    Without a KL term a rollout with advantage 0 has a loss term that is 0 for every weight, so only the
    others go through the model (the leave-out replay does the same); their influence is exactly 0.
    """

    step: int
    rollout_ids: np.ndarray
    batch: dict
    num_items: int
    n_rows: int
    ref_logps: torch.Tensor | None


@dataclass
class State:
    """The training state before step `step`: weights and AdamW's moments in the optimizer's parameter order
    (moments None before the first update), AdamW's update count, each group's learning rate, the schedule."""

    step: int
    weights: list[torch.Tensor]
    exp_avg: list[torch.Tensor] | None
    exp_avg_sq: list[torch.Tensor] | None
    adam_step: int
    lrs: list[float]
    schedule: dict

    def save(self, path: Path) -> None:
        torch.save(self.__dict__, path)

    @classmethod
    def load(cls, path: Path, device) -> State:
        return cls(**torch.load(path, map_location=device, weights_only=False))

    def to(self, dtype: torch.dtype) -> State:
        """The same state with weights and moments cast to `dtype` (for a float64 trajectory)."""

        def cast(tensors):
            return None if tensors is None else [t.to(dtype) for t in tensors]

        return State(
            self.step,
            cast(self.weights),
            cast(self.exp_avg),
            cast(self.exp_avg_sq),
            self.adam_step,
            self.lrs,
            self.schedule,
        )


class Trajectory:
    """Replays the logged steps on `model` (loaded at the step-0 weights) with the logged advantages.

    `weights` of `step` and `run` map rollout ids to the multiplier of their loss term (1 where absent).
    """

    def __init__(self, model, ref_model, rollouts: pl.DataFrame, grpo: Grpo, device: dict, pad_id: int):
        self.model, self.ref_model, self.grpo, self.pad_id = model, ref_model, grpo, pad_id
        self.device = device["device"]
        self.dtype = next(model.parameters()).dtype
        self.optimizer, self.scheduler = optimizer_and_schedule(model, grpo, device)
        self.params = [p for group in self.optimizer.param_groups for p in group["params"]]
        names = {id(p): n for n, p in model.named_parameters()}
        self.names = [names[id(p)] for p in self.params]
        self.by_step = rollouts.sort("rollout_id").partition_by("step", as_dict=True, maintain_order=True)
        self._rows: dict[int, StepRows] = {}
        self.done = 0  # optimizer steps applied so far
        model.train()

    # Data ---------------------------------------------------------------------------------------------

    def rows(self, step: int) -> StepRows:
        """The step's model inputs (built once; the KL term's reference log-probs too, they never change)."""
        if step not in self._rows:
            rows = self.by_step[(step,)]
            batch = step_batch(rows, self.pad_id)
            batch["advantages"] = batch["advantages"].to(self.dtype)
            num_items, n_rows = int(batch["completion_mask"].sum()), rows.height
            ids = rows["rollout_id"].to_numpy()
            if not self.grpo.beta:
                used = batch["advantages"] != 0
                batch, ids = {k: v[used] for k, v in batch.items()}, ids[used.numpy()]
            batch = batch_to(batch, self.device)
            ref = None
            if self.grpo.beta and len(ids):
                with torch.no_grad():
                    ref = completion_logps(self.ref_model, batch, self.grpo.temperature)
            self._rows[step] = StepRows(step, ids, batch, num_items, n_rows, ref)
        return self._rows[step]

    def losses(self, logps, rows: StepRows, select=None):
        """TRL's per-rollout loss terms of the step (of the rows in `select`, normalized as the whole step)."""
        batch, ref = rows.batch, rows.ref_logps
        if select is not None:
            batch = {k: v[select] for k, v in batch.items()}
            ref = None if ref is None else ref[select]
        g = self.grpo
        return rollout_losses(
            logps, batch, g.loss_type, g.beta, g.max_new_tokens, ref, num_items=rows.num_items, n_rows=rows.n_rows
        )

    # Training -----------------------------------------------------------------------------------------

    def step(self, weights: dict[int, float] | None = None) -> float:
        """Apply the next logged step; returns its gradient norm before clipping."""
        rows = self.rows(self.done)
        for p in self.params:  # a step whose loss is 0 still updates (AdamW's moments decay), as TRL's would
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.zero_()
        factor = np.array([weights.get(int(r), 1.0) for r in rows.rollout_ids]) if weights else None
        keep = np.ones(len(rows.rollout_ids), bool) if factor is None else factor != 0
        if keep.any():
            select = None if keep.all() else torch.from_numpy(keep).to(self.device)
            batch = rows.batch if select is None else {k: v[select] for k, v in rows.batch.items()}
            terms = self.losses(completion_logps(self.model, batch, self.grpo.temperature), rows, select)
            if factor is not None:
                terms = terms * torch.tensor(factor[keep], dtype=terms.dtype, device=terms.device)
            terms.sum().backward()
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.grpo.max_grad_norm))
        self.optimizer.step()
        self.scheduler.step()
        self.done += 1
        return norm

    def run(self, stop: int, weights: dict[int, float] | None = None, on_step=None) -> list[float]:
        """Apply the steps up to `stop` (exclusive); `on_step(step_done)` after each. Returns the grad norms."""
        norms = []
        while self.done < stop:
            norms.append(self.step(weights))
            if on_step is not None:
                on_step(self.done)
        return norms

    # States -------------------------------------------------------------------------------------------

    def state(self, where="cpu") -> State:
        """A copy of the current training state, in host memory (or on the device `where`)."""
        opt = [self.optimizer.state.get(p, {}) for p in self.params]
        started = all("exp_avg" in s for s in opt)

        def copy_of(tensors):
            return [t.detach().to(where, copy=True) for t in tensors]

        return State(
            step=self.done,
            weights=copy_of(self.params),
            exp_avg=copy_of(s["exp_avg"] for s in opt) if started else None,
            exp_avg_sq=copy_of(s["exp_avg_sq"] for s in opt) if started else None,
            adam_step=int(opt[0]["step"]) if started else 0,
            lrs=[float(g["lr"]) for g in self.optimizer.param_groups],
            schedule=copy.deepcopy(self.scheduler.state_dict()),
        )

    def restore(self, state: State) -> None:
        """Continue training from `state` (copied: later steps leave it untouched)."""
        self.set_weights(state.weights)
        self.optimizer.state.clear()
        if state.exp_avg is not None:
            for p, m, v in zip(self.params, state.exp_avg, state.exp_avg_sq, strict=True):
                step = torch.tensor(float(state.adam_step), dtype=torch.float32, device=p.device)
                moments = {"exp_avg": m.to(p.device, copy=True), "exp_avg_sq": v.to(p.device, copy=True)}
                self.optimizer.state[p] = {"step": step, **moments}
        for group, lr in zip(self.optimizer.param_groups, state.lrs, strict=True):
            group["lr"] = lr
        self.scheduler.load_state_dict(copy.deepcopy(state.schedule))
        self.done = state.step

    def set_weights(self, weights: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, w in zip(self.params, weights, strict=True):
                p.copy_(w)
