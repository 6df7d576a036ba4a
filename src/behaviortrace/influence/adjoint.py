"""One replayed step, backwards: how f(w_T) depends on the state before the step and on each rollout's weight.

A step maps (w, m, v) and the rollout weights u (1 as trained) to the next state:

    g  = grad L(w; u)                                  the step's gradient at the data weights u
    c  = min(1, C / (|g| + 1e-6))                      clipping (torch's clip_grad_norm_)
    m' = b1 m + (1 - b1) c g,   v' = b2 v + (1 - b2) (c g)^2
    w' = w (1 - lr wd) - lr / bc1 * m' / (sqrt(v' / bc2) + eps_adam)      AdamW, bc_i = 1 - b_i^n

with L(w; u) = sum_z u_z A_z(u) l_z(w) / N(u) (DAPO; other loss types normalize by their own weighted counts):
A_z(u) the group-relative advantages with u as frequency weights, N(u) = sum_z u_z n_z the weighted token
count (trajectory.py). Given the adjoints of (w', m', v') (the derivatives of f(w_T) with respect to them), this
returns those of (w, m, v), and for every rollout of the step d f / d u_z in four parts, whose sum is I_z
through the advantages and whose first part is I_z with advantages and normalization held:

- `held`: z's own term, <gamma, grad l_z> A_z / N with gamma the adjoint of the unclipped gradient g;
- `own_advantage`: through z's own advantage (z's weight in its group's mean and std);
- `siblings`: through the other rollouts' advantages (z's weight in their group's, or the batch's, statistics);
- `normalization`: through N (and the rollout count).

They are four inputs of one double backward (zero-valued, requiring grad), whose derivative with respect to the
weights also gives the adjoint of w its Hessian-vector product H gamma of the step's loss; no per-rollout
gradient is ever formed. AdamW's and clipping's derivatives are written out: d sqrt(v')/dv' has no value where
v' = 0, and there m' = 0 too (no gradient ever reached the coordinate), so its term is 0.

The gradient is differentiated as a function of w. TRL's loss holds its importance ratio at 1 with the
old log-probs detached at the current weights (on-policy), so its value carries no second-order
information; `surrogate_terms` are per-rollout terms with the same gradient for every w, which autograd
can differentiate twice (tests/test_influence.py checks both).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from behaviortrace.gradients.batch import completion_logps
from behaviortrace.influence.trajectory import State, StepRows, Trajectory
from behaviortrace.train.trl_surface import token_weights, weighted_advantages

CHANNELS = ("held", "own_advantage", "siblings", "normalization")


@dataclass
class Adjoint:
    """Derivatives of f(w_T) with respect to the weights and AdamW's two moments, per parameter."""

    w: list[torch.Tensor]
    m: list[torch.Tensor]
    v: list[torch.Tensor]

    @classmethod
    def at_end(cls, grad_f: list[torch.Tensor]) -> Adjoint:
        return cls(grad_f, [torch.zeros_like(g) for g in grad_f], [torch.zeros_like(g) for g in grad_f])


def surrogate_terms(logps, rows: StepRows, grpo, advantages=None, num_items=None, n_rows=None) -> torch.Tensor:
    """Per-rollout terms whose gradient at any weights is TRL's on-policy gradient of the rollout's share.

    With the ratio exp(logp - logp.detach()) at 1, TRL's token term -A ratio has gradient -A grad logp, and
    its KL term k3(ref - logp) ratio (k3(x) = e^x - x - 1) has gradient beta (logp - ref) grad logp: the
    gradients of -A logp and beta (logp - ref)^2 / 2, weighted per token as TRL normalizes the step. The
    advantages and counts default to the logged ones.
    """
    batch = rows.batch
    advantages = batch["advantages"] if advantages is None else advantages
    per_token = -advantages.unsqueeze(1) * logps
    if grpo.beta:
        per_token = per_token + grpo.beta * (logps - rows.ref_logps) ** 2 / 2
    items = rows.num_items if num_items is None else num_items
    items = items.clamp(min=1) if torch.is_tensor(items) else max(items, 1)
    weights = token_weights(
        grpo.loss_type, batch["completion_mask"], rows.n_rows if n_rows is None else n_rows, items, grpo.max_new_tokens
    )
    return (per_token * weights).sum(-1)


def twice_differentiable():
    """The math kernel of scaled-dot-product attention can be differentiated twice; the fused CPU one cannot."""
    return sdpa_kernel(SDPBackend.MATH)


def channel_terms(logps, rows: StepRows, grpo, eps: dict[str, torch.Tensor]) -> torch.Tensor:
    """The surrogate terms of the rollouts that go through the model with every rollout's weight split in four
    inputs (`eps`: one zero-valued vector per channel, CHANNELS): u = 1 + eps enters z's own term (`held`, used
    rows only), z's own advantage, its siblings' advantages and the normalization."""
    n = len(rows.every)
    own, others = 1 + eps["own_advantage"], 1 + eps["siblings"]
    off_diagonal = 1 - torch.eye(n, dtype=own.dtype, device=own.device)
    matrix = others.unsqueeze(0) * off_diagonal + torch.diag(own)  # row z: the weights z's advantage is taken with
    every = rows.logged + weighted_advantages(rows.rewards, rows.same_group, matrix, grpo.scale_rewards) - rows.at_one
    counted = 1 + eps["normalization"]
    terms = surrogate_terms(logps, rows, grpo, every[rows.used], (counted * rows.tokens).sum(), counted.sum())
    return (1 + eps["held"]) * terms


def step_back(traj: Trajectory, state: State, adj: Adjoint) -> tuple[Adjoint, dict[str, np.ndarray]]:
    """The adjoint before the step that starts from `state`, and every rollout's d f / d u_z per channel
    (CHANNELS, in `traj.rows(state.step).every` order; their sum is I_z through the advantages, `held` is I_z with
    the advantages and normalization held)."""
    grpo, opt = traj.grpo, traj.optimizer
    rows = traj.rows(state.step)
    traj.set_weights(state.weights)
    params = traj.params
    size = len(rows.every)
    eps = {
        name: torch.zeros(len(rows.rollout_ids) if name == "held" else size, dtype=traj.dtype, device=traj.device)
        for name in CHANNELS
    }
    for e in eps.values():
        e.requires_grad_(True)
    if len(rows.rollout_ids):
        with twice_differentiable():
            logps = completion_logps(traj.model, rows.batch, grpo.temperature)
        loss = channel_terms(logps, rows, grpo, eps).sum()
        grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
    else:
        grads = [None] * len(params)
    g = [torch.zeros_like(p) if x is None else x.detach() for p, x in zip(params, grads, strict=True)]

    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x) for x in g]))
    limit = grpo.max_grad_norm
    coef = float(torch.clamp(limit / (norm + 1e-6), max=1.0))
    n = state.adam_step + 1

    # Back through AdamW's update to the adjoint of the clipped gradient, per parameter (its group's settings).
    group_of = {}
    for group, lr in zip(opt.param_groups, state.lrs, strict=True):
        for p in group["params"]:
            group_of[id(p)] = (lr, group["weight_decay"], *group["betas"], group["eps"])
    clipped_adj, w_adj, m_adj, v_adj = [], [], [], []
    for i, p in enumerate(params):
        lr, decay, beta1, beta2, adam_eps = group_of[id(p)]
        bc1, bc2_sqrt = 1 - beta1**n, (1 - beta2**n) ** 0.5
        ghat = coef * g[i]
        m0 = state.exp_avg[i].to(p.device) if state.exp_avg is not None else torch.zeros_like(p)
        v0 = state.exp_avg_sq[i].to(p.device) if state.exp_avg_sq is not None else torch.zeros_like(p)
        m1 = beta1 * m0 + (1 - beta1) * ghat
        v1 = beta2 * v0 + (1 - beta2) * ghat * ghat
        root = v1.sqrt()
        denom = root / bc2_sqrt + adam_eps
        a = adj.w[i]
        adj_m = adj.m[i] - a * (lr / bc1) / denom
        # d/dv' of -lr/bc1 m'/denom is lr/bc1 m'/denom^2 / (2 bc2_sqrt sqrt(v')); 0 where v' = 0 (and m' = 0).
        dv = torch.where(
            root > 0, m1 / (denom * denom * 2 * bc2_sqrt * root.clamp_min(torch.finfo(root.dtype).tiny)), 0
        )
        adj_v = adj.v[i] + a * (lr / bc1) * dv
        clipped_adj.append((1 - beta1) * adj_m + 2 * (1 - beta2) * ghat * adj_v)
        w_adj.append(a * (1 - lr * decay))
        m_adj.append(beta1 * adj_m)
        v_adj.append(beta2 * adj_v)

    # Back through clipping: when it is active, the coefficient depends on the gradient too.
    gamma = [coef * x for x in clipped_adj]
    if coef < 1.0:
        inner = sum(float((x * y).sum()) for x, y in zip(g, clipped_adj, strict=True))
        scale = limit / (float(norm) + 1e-6) ** 2 * inner / float(norm)
        gamma = [x - scale * y for x, y in zip(gamma, g, strict=True)]

    channels = {name: np.zeros(size) for name in CHANNELS}
    if len(rows.rollout_ids):
        dot = sum((x * y).sum() for x, y in zip(grads, gamma, strict=True) if x is not None)
        *hvp, d_held, d_own, d_siblings, d_norm = torch.autograd.grad(
            dot, [*params, *(eps[name] for name in CHANNELS)], allow_unused=True
        )
        for i, h in enumerate(hvp):
            if h is not None:
                w_adj[i] = w_adj[i] + h.detach()
        used = rows.used.cpu().numpy()
        for name, d in zip(CHANNELS, (d_held, d_own, d_siblings, d_norm), strict=True):
            if d is not None:
                values = d.detach().double().cpu().numpy()
                if name == "held":
                    channels[name][used] = values
                else:
                    channels[name] = values
    return Adjoint(w_adj, m_adj, v_adj), channels
