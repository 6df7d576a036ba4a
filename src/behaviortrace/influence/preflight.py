"""Before a model trains: can the exact influence run on it?

The influence job differentiates through training: its reverse sweep takes a double backward through each step's
loss (adjoint.py), in `influence.dtype`, and its finite-difference checks retrain in float64 throughout
(model/precision.py), which stops at any operation that leaves float64 with a gradient. Both are tried here on a
copy of the model and a small batch, so that a model that cannot take them is refused before training instead of
failing in the influence job after it.
"""

from __future__ import annotations

import copy

import torch

from behaviortrace.common.errors import describe
from behaviortrace.gradients.batch import completion_logps
from behaviortrace.influence.adjoint import twice_differentiable
from behaviortrace.model.precision import keep_float64


def influence_problems(model, batch: dict, dtype: str, fd_checks: bool) -> list[str]:
    """Why the influence job (in `dtype`, with float64 finite-difference checks if `fd_checks`) cannot run on `model`:
    a forward, backward and double backward of `batch`'s advantage-weighted completion log-probs in each dtype."""
    problems = []
    for name in sorted({dtype, "float64" if fd_checks else dtype}):
        copied = copy.deepcopy(model).to(getattr(torch, name))
        if name == "float64":
            keep_float64(copied)
        params = [p for p in copied.parameters() if p.requires_grad]
        device = params[0].device
        rows = {k: v.to(device) for k, v in batch.items()}
        try:
            with twice_differentiable():
                logps = completion_logps(copied, rows, 1.0)
            loss = (logps * rows["completion_mask"] * rows["advantages"].to(logps.dtype).unsqueeze(1)).sum()
            grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
            dot = sum((g * g.detach()).sum() for g in grads if g is not None)
            torch.autograd.grad(dot, params, allow_unused=True)
        except Exception as err:  # whatever the model's code raises: the message says what and where
            what = "its float64 finite-difference checks" if name != dtype else f"influence.dtype {dtype}"
            problems.append(f"{what}: {describe(err)}")
    return problems
