"""The replayed training of one seed with a data weight on every rollout: the forward pass of the exact
influence, and the retraining its checks and its LDS compare against.

Each step repeats what TRL did (trl 1.16, on-policy, one optimizer step per generation batch), by the same
code path as the leave-out replay (replay/retrain.py): the step's rollouts padded as TRL padded the whole
batch, TRL's per-rollout loss and normalization (train/trl_surface.py), gradient clipping, and the AdamW
optimizer and schedule transformers' Trainer builds. Rollout z carries a weight w_z (1 where none is given),
with one of two meanings (`influence.semantics`, docs/influence.md):

- `advantages`: w_z is a frequency weight in GRPO's loss. It enters its group's reward mean and standard
  deviation (weighted statistics), the step's normalization (a weighted token and rollout count) and its own
  term. w_z = 0 is the step without z, as the leave-out replay takes it; every weight 1 is training as logged.
- `held`: w_z multiplies z's own term only; the advantages and the normalization stay as logged.

The advantages are anchored at the logged ones, A(w) = A_logged + a(w) - a(1) with a the weighted formula, so
that weight 1 is training as logged to the bit in both meanings; a(1) equals the logged advantages to
float32's rounding (a test).

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
from behaviortrace.influence.sets import SEMANTICS
from behaviortrace.train.trl_surface import optimizer_and_schedule, rollout_losses, weighted_advantages


@dataclass
class StepRows:
    """One step: every rollout's reward, group and token count (`every`, in rollout-id order), and the rollouts
    that go through the model (`rollout_ids`, at positions `used` of `every`) as TRL's padded batch.

    Without a KL term a rollout whose group's rewards are all equal has advantage 0 at every weight, so its term
    is 0 and only the others go through the model (the leave-out replay does the same); its weight still counts
    in the normalization under `advantages`.
    """

    step: int
    every: np.ndarray
    rollout_ids: np.ndarray
    used: torch.Tensor
    batch: dict
    num_items: int
    n_rows: int
    ref_logps: torch.Tensor | None
    rewards: torch.Tensor
    same_group: torch.Tensor
    tokens: torch.Tensor
    logged: torch.Tensor
    at_one: torch.Tensor


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
    """Replays the logged steps on `model` (loaded at the step-0 weights) with data weights on the rollouts.

    `weights` of `step` and `run` map rollout ids to their weight (1 where absent), with the meaning `semantics`
    (`advantages` or `held`, the module's docstring) unless a call names the other.
    """

    def __init__(self, model, ref_model, rollouts: pl.DataFrame, grpo: Grpo, device: dict, pad_id: int, semantics: str):
        if semantics not in SEMANTICS:
            raise ValueError(f"semantics {semantics!r} is not one of {SEMANTICS}")
        self.model, self.ref_model, self.grpo, self.pad_id = model, ref_model, grpo, pad_id
        self.semantics = semantics
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
            every = rows["rollout_id"].to_numpy()

            def tensor(values):
                return torch.tensor(np.asarray(values, dtype=np.float64), dtype=self.dtype, device=self.device)

            reward, groups = rows["reward"].to_numpy(), rows["group_id"].to_numpy()
            rewards, same_group = tensor(reward), tensor(groups[:, None] == groups[None, :])
            logged = batch["advantages"].to(self.device)
            at_one = weighted_advantages(rewards, same_group, torch.ones_like(rewards), self.grpo.scale_rewards)
            tokens = tensor(batch["completion_mask"].sum(-1).numpy())
            used = np.ones(len(every), bool)
            if not self.grpo.beta:  # a term that is 0 at every weight: advantage 0 logged, rewards equal in the group
                spread = ((groups[:, None] == groups[None, :]) & (reward[:, None] != reward[None, :])).any(1)
                used = (logged != 0).cpu().numpy() | spread
            batch = batch_to({k: v[torch.from_numpy(used)] for k, v in batch.items()}, self.device)
            ref = None
            if self.grpo.beta and used.any():
                with torch.no_grad():
                    ref = completion_logps(self.ref_model, batch, self.grpo.temperature)
            self._rows[step] = StepRows(
                step=step,
                every=every,
                rollout_ids=every[used],
                used=torch.from_numpy(np.flatnonzero(used)).to(self.device),
                batch=batch,
                num_items=num_items,
                n_rows=n_rows,
                ref_logps=ref,
                rewards=rewards,
                same_group=same_group,
                tokens=tokens,
                logged=logged,
                at_one=at_one,
            )
        return self._rows[step]

    def losses(self, logps, rows: StepRows, weights=None, semantics: str | None = None, select=None):
        """Each rollout's term of TRL's loss (the rows in `select` of those that go through the model), its weight
        included: `weights` [every rollout of the step] (None: all 1) under `semantics` (the trajectory's by
        default). With weights held, the step's logged advantages and normalization; with `advantages`, the
        weighted advantages, token count and rollout count."""
        semantics = semantics or self.semantics
        batch, ref = rows.batch, rows.ref_logps
        if semantics == "held":
            advantages, num_items, n_rows = batch["advantages"], rows.num_items, rows.n_rows
        else:
            w = torch.ones_like(rows.rewards) if weights is None else weights
            every = rows.logged + weighted_advantages(rows.rewards, rows.same_group, w, self.grpo.scale_rewards)
            advantages = (every - rows.at_one)[rows.used]
            num_items, n_rows = (w * rows.tokens).sum(), w.sum()
        own = None if weights is None else weights[rows.used]
        if select is not None:
            batch = {k: v[select] for k, v in batch.items()}
            ref = None if ref is None else ref[select]
            advantages, own = advantages[select], None if own is None else own[select]
        g = self.grpo
        terms = rollout_losses(
            logps,
            {**batch, "advantages": advantages},
            g.loss_type,
            g.beta,
            g.max_new_tokens,
            ref,
            num_items=num_items,
            n_rows=n_rows,
        )
        return terms if own is None else terms * own

    def weight_vector(self, rows: StepRows, weights: dict[int, float] | None):
        """The weights of every rollout of the step (1 where `weights` has none); None when all are 1."""
        if not weights or not any(int(z) in weights for z in rows.every):
            return None
        return torch.tensor([weights.get(int(z), 1.0) for z in rows.every], dtype=self.dtype, device=self.device)

    # Training -----------------------------------------------------------------------------------------

    def step(self, weights: dict[int, float] | None = None, semantics: str | None = None) -> float:
        """Apply the next logged step with the rollout `weights` (their meaning: `semantics`, the trajectory's by
        default); returns its gradient norm before clipping."""
        rows = self.rows(self.done)
        for p in self.params:  # a step whose loss is 0 still updates (AdamW's moments decay), as TRL's would
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.zero_()
        w = self.weight_vector(rows, weights)
        keep = torch.ones(len(rows.rollout_ids), dtype=torch.bool) if w is None else (w[rows.used] != 0).cpu()
        if keep.any():  # a zero weight's term is 0: those rollouts skip the model
            select = None if keep.all() else keep.to(self.device)
            batch = rows.batch if select is None else {k: v[select] for k, v in rows.batch.items()}
            logps = completion_logps(self.model, batch, self.grpo.temperature)
            self.losses(logps, rows, w, semantics, select).sum().backward()
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.grpo.max_grad_norm))
        self.optimizer.step()
        self.scheduler.step()
        self.done += 1
        return norm

    def run(
        self, stop: int, weights: dict[int, float] | None = None, on_step=None, semantics: str | None = None
    ) -> list[float]:
        """Apply the steps up to `stop` (exclusive); `on_step(step_done)` after each. Returns the grad norms."""
        norms = []
        while self.done < stop:
            norms.append(self.step(weights, semantics))
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
