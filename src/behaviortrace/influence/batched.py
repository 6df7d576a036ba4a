"""Many retrainings of one seed in one pass, for the LDS: B copies of the trainable weights are stacked, every
step's gradient of all B copies is taken at once (torch.func: vmap over the copies of a per-copy gradient),
then each copy is clipped and updated by AdamW, vectorized over the copies.

It is the Trajectory's step written without an optimizer object: the same loss terms (Trajectory.losses: each
rollout's term at its data weight, under either meaning of the weights), the same clipping as `clip_grad_norm_`
and the same AdamW formula as torch's, the same learning rate at each step (read off the run's own schedule). A
test holds it to the plain retraining (retrain.value_after) set by set.

Why: a tiny model leaves a GPU's kernels mostly idle, and one pass over B copies may then cost less than B
passes. On a CPU it costs more (a retraining one at a time skips the rollouts it zeroes, and attention has no
vmap batching rule there); benchmarks/lds_batch.py measures it on the machine at hand.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch.func import functional_call, grad, vmap

from behaviortrace.gradients.batch import completion_logps
from behaviortrace.influence.trajectory import State, Trajectory


class _Functional:
    """The model called with given weights (by name), for completion_logps."""

    def __init__(self, model, weights: dict[str, torch.Tensor]):
        self.model, self.weights = model, weights

    def __call__(self, **inputs):
        return functional_call(self.model, self.weights, kwargs=inputs)


def _adamw_settings(traj: Trajectory) -> list[dict]:
    """Per trainable parameter (the trajectory's order): its group's index, betas, eps and weight decay."""
    opt = traj.optimizer
    if type(opt) is not torch.optim.AdamW:
        raise NotImplementedError(f"batched retraining knows AdamW only, not {type(opt).__name__}")
    out = []
    for index, group in enumerate(opt.param_groups):
        if group.get("amsgrad") or group.get("maximize"):
            raise NotImplementedError("batched retraining knows AdamW without amsgrad or maximize")
        b1, b2 = group["betas"]
        out += [{"group": index, "b1": b1, "b2": b2, "eps": group["eps"], "wd": group["weight_decay"]}] * len(
            group["params"]
        )
    return out


def _learning_rates(traj: Trajectory, start: State, end: int) -> list[list[float]]:
    """Each group's learning rate at each step from `start` to `end`: the schedule does not depend on data."""
    traj.restore(start)
    out = []
    with warnings.catch_warnings():  # stepping a schedule without its optimizer warns; nothing is trained here
        warnings.simplefilter("ignore")
        for _ in range(start.step, end):
            out.append([float(g["lr"]) for g in traj.optimizer.param_groups])
            traj.scheduler.step()
    return out


def values_after(
    traj: Trajectory, start: State, weights: list[dict[int, float]], end: int, objective, semantics: str | None = None
) -> list[float]:
    """f(w_end) for each entry of `weights` (rollout id -> weight), all retrained from `start` at once under
    `semantics` (the trajectory's by default): what [retrain.value_after(traj, start, w, end, objective, semantics)
    for w in weights] computes."""
    n, names = len(weights), traj.names
    settings = _adamw_settings(traj)
    lrs = _learning_rates(traj, start, end)
    dtype, device = traj.dtype, traj.device

    def stacked(tensors):
        return [t.to(device, dtype).unsqueeze(0).repeat(n, *[1] * t.dim()) for t in tensors]

    w = stacked(start.weights)
    m = stacked(start.exp_avg) if start.exp_avg is not None else [torch.zeros_like(t) for t in w]
    v = stacked(start.exp_avg_sq) if start.exp_avg_sq is not None else [torch.zeros_like(t) for t in w]
    adam_step = start.adam_step

    for step in range(start.step, end):
        rows = traj.rows(step)
        grads = [torch.zeros_like(t) for t in w]
        if len(rows.rollout_ids):
            factor = torch.tensor(
                np.array([[ws.get(int(r), 1.0) for r in rows.every] for ws in weights]), dtype=dtype
            ).to(device)

            def loss(flat, f, rows=rows):
                logps = completion_logps(
                    _Functional(traj.model, dict(zip(names, flat, strict=True))), rows.batch, traj.grpo.temperature
                )
                return traj.losses(logps, rows, f, semantics).sum()

            grads = list(vmap(grad(loss), randomness="same")(tuple(w), factor))
        # clip_grad_norm_: the norm of the per-parameter norms; every gradient times min(1, max / (norm + 1e-6)).
        norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads], dim=1).norm(dim=1)
        coef = (traj.grpo.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
        adam_step += 1
        for i, s in enumerate(settings):
            g = grads[i] * coef.view(-1, *[1] * (grads[i].dim() - 1))
            lr = lrs[step - start.step][s["group"]]
            # torch.optim.AdamW's single-tensor update, in its order of operations.
            w[i].mul_(1 - lr * s["wd"])
            m[i].lerp_(g, 1 - s["b1"])
            v[i].mul_(s["b2"]).addcmul_(g, g, value=1 - s["b2"])
            step_size = lr / (1 - s["b1"] ** adam_step)
            denom = (v[i].sqrt() / (1 - s["b2"] ** adam_step) ** 0.5).add_(s["eps"])
            w[i].addcdiv_(m[i], denom, value=-step_size)

    values = []
    for b in range(n):
        traj.set_weights([t[b] for t in w])
        values.append(objective.value(traj.model))
    return values
