"""Per-rollout loss terms sum to the loss TRL optimized: their gradient equals TRL's pre-clip step gradient."""

from __future__ import annotations

import copy

import polars as pl
import pytest
import torch

from behaviortrace import models
from behaviortrace.grpo import RolloutLoggingGRPOTrainer
from behaviortrace.rollout_loss import completion_logps, rollout_losses, step_batch
from grpo_helpers import run_training


class GradSpy(RolloutLoggingGRPOTrainer):
    """Copies the accumulated gradient of each step just before TRL clips it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_grads: dict[int, torch.Tensor] = {}

    def _clip_grad_norm(self, model):
        self.step_grads[self.state.global_step] = torch.cat(
            [p.grad.detach().flatten().clone() for p in model.parameters() if p.requires_grad])
        return super()._clip_grad_norm(model)


def flat_grad(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])


@pytest.mark.parametrize("loss_type, beta", [("dapo", 0.1), ("grpo", 0.0)])
def test_rollout_terms_reproduce_trls_step_gradient(tmp_path, cfg, base_model_dir, prompts, cpu, loss_type, beta):
    run_cfg = copy.deepcopy(cfg)
    run_cfg["grpo"].update(steps=3, save_every=1, loss_type=loss_type, beta=beta)
    run_cfg["planting"]["window"] = [0, 1]
    rollouts, info = run_training(run_cfg, base_model_dir, prompts["train"], 5, tmp_path, cpu, trainer_cls=GradSpy)
    grpo_cfg = run_cfg["grpo"]
    ref, _ = models.load(base_model_dir, cpu)
    for step, trl_grad in info["trainer"].step_grads.items():
        model, tokenizer = models.load(tmp_path / "train" / f"checkpoint-{step}", cpu)
        batch = step_batch(rollouts.filter(pl.col("step") == step), tokenizer.pad_token_id)
        logps = completion_logps(model, batch, grpo_cfg["temperature"])
        ref_logps = completion_logps(ref, batch, grpo_cfg["temperature"]).detach() if beta else None
        terms = rollout_losses(logps, batch, loss_type, beta, grpo_cfg["max_new_tokens"], ref_logps)
        terms.sum().backward()
        ours = flat_grad(model)
        assert ours.norm() > 0
        rel = ((ours - trl_grad).norm() / trl_grad.norm()).item()
        assert rel <= 1e-4, (step, rel)


def test_per_row_gradients_sum_to_the_batch_gradient(cfg, base_model_dir, prompts, cpu, tmp_path):
    """One rollout at a time (its own forward, same padded layout) adds up to the batched gradient."""
    rollouts, _ = run_training(cfg, base_model_dir, prompts["train"], 6, tmp_path, cpu)
    model, tokenizer = models.load(base_model_dir, cpu)
    batch = step_batch(rollouts.filter(pl.col("step") == 0), tokenizer.pad_token_id)
    num_items = int(batch["completion_mask"].sum())
    rollout_losses(completion_logps(model, batch, 1.0), batch, "dapo", 0.0, 10).sum().backward()
    batched = flat_grad(model).clone()
    total = torch.zeros_like(batched)
    for i in range(batch["advantages"].shape[0]):
        model.zero_grad()
        row = {k: v[i:i + 1] for k, v in batch.items()}
        rollout_losses(completion_logps(model, row, 1.0), row, "dapo", 0.0, 10, num_items=num_items).sum().backward()
        total += flat_grad(model)
    assert ((total - batched).norm() / batched.norm()).item() <= 1e-5
