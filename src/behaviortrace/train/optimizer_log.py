"""What AdamW did at each step, kept so that a rollout's effect can be followed through the optimizer.

Per step (in the step log): the optimizer's update count, betas, eps and weight decay, beside the
learning rate and clip coefficient the trainer already logs. At each saved checkpoint c below the last
step: AdamW's second moment right after the update of step c (`preconditioner_path`), i.e. the
denominator the optimizer divided step c's update by. Its bias-corrected form, `denominator`, is what
the targets stage divides target gradients by (estimators/adam_tracin.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import TrainerCallback

ADAM_DIR = "adam"


def preconditioner_path(train_dir: Path, step: int) -> Path:
    return Path(train_dir) / ADAM_DIR / f"step{step:05d}.pt"


def _state_of_first(optimizer) -> dict:
    for group in optimizer.param_groups:
        for p in group["params"]:
            return optimizer.state.get(p, {})
    return {}


def settings(optimizer) -> dict:
    """AdamW's betas, eps and weight decay (one parameter group)."""
    group = optimizer.param_groups[0]
    if "betas" not in group or "eps" not in group:
        raise TypeError(f"the training optimizer is {type(optimizer).__name__}, not AdamW: no betas or eps to log")
    return {
        "beta1": float(group["betas"][0]),
        "beta2": float(group["betas"][1]),
        "eps": float(group["eps"]),
        "weight_decay": float(group.get("weight_decay", 0.0)),
    }


def step_facts(optimizer) -> dict:
    """The optimizer's settings and the update count of the step about to be applied."""
    state = _state_of_first(optimizer)
    done = int(state["step"]) if "step" in state else 0
    return {"adam_step": done + 1, **settings(optimizer)}


class SavePreconditioner(TrainerCallback):
    """After the update of each step in `steps`, saves AdamW's second moment per named parameter."""

    def __init__(self, train_dir: Path, steps: list[int]):
        self.train_dir, self.steps = Path(train_dir), set(steps)

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        step = state.global_step - 1  # the step whose update was just applied
        if step in self.steps:
            save_preconditioner(model, optimizer, step, preconditioner_path(self.train_dir, step))
        return control


def save_preconditioner(model, optimizer, step: int, path: Path) -> None:
    """exp_avg_sq of every trainable parameter and the settings to bias-correct it; written whole or not at all."""
    moments, count = {}, None
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        state = optimizer.state.get(p)
        if not state or "exp_avg_sq" not in state:
            raise RuntimeError(f"optimizer has no second moment for {name} after step {step}")
        moments[name] = state["exp_avg_sq"].detach().float().cpu().clone()
        count = int(state["step"])
    payload = {"step": step, "adam_step": count, **settings(optimizer), "exp_avg_sq": moments}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load_preconditioner(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def denominator(saved: dict, device="cpu") -> dict[str, torch.Tensor]:
    """AdamW's per-coordinate divisor sqrt(v / (1 - beta2^n)) + eps, as torch.optim.AdamW computes it."""
    correction = (1 - saved["beta2"] ** saved["adam_step"]) ** 0.5
    return {name: (v.to(device).sqrt() / correction).add_(saved["eps"]) for name, v in saved["exp_avg_sq"].items()}


def checkpoint_denominator(path: Path | None, step: int, device="cpu") -> tuple[dict[str, torch.Tensor] | None, dict]:
    """AdamW's divisor at checkpoint `step` from its saved second moment at `path` (None: none saved), and the
    optimizer's betas and eps; refuses a file saved after another number of updates."""
    if path is None:
        return None, {}
    saved = load_preconditioner(path)
    if saved["adam_step"] != step + 1:
        raise RuntimeError(
            f"{path}: AdamW had made {saved['adam_step']} updates after step {step}, expected {step + 1}; "
            "retrain this seed"
        )
    return denominator(saved, device), {"beta1": saved["beta1"], "beta2": saved["beta2"], "eps": saved["eps"]}
