"""Per-rollout loss terms sum to the loss TRL optimized: their gradient equals TRL's pre-clip step gradient."""

from __future__ import annotations

import copy

import polars as pl
import pytest
import torch

from behaviortrace.gradients.batch import completion_logps, rows_of, step_batch
from behaviortrace.gradients.per_example import Capture, param_layout
from behaviortrace.model import models
from behaviortrace.sketch.maps import materialize
from behaviortrace.tools.grpo_checks import GradSpy, run_training
from behaviortrace.train.trl_surface import rollout_losses
from tolerance import within


def flat_grad(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])


def captured_gradients(model, ref, batch, loss_type, beta, temperature, max_len, chunk) -> dict:
    """Per-rollout gradients from the hooked capture, a chunk of rows at a time, normalized as the whole step."""
    n, num_items = batch["advantages"].shape[0], int(batch["completion_mask"].sum())
    layout = param_layout(model)
    parts = []
    for start in range(0, n, chunk):
        rows = rows_of(batch, start, start + chunk)
        with Capture(model) as cap:
            logps = completion_logps(model, rows, temperature)
            ref_logps = completion_logps(ref, rows, temperature).detach() if beta else None
            rollout_losses(
                logps, rows, loss_type, beta, max_len, ref_logps, num_items=num_items, n_rows=n
            ).sum().backward()
            parts.append(materialize(cap.finish(), layout))
    return {name: torch.cat([p[name] for p in parts]) for name in layout}


@pytest.mark.parametrize("loss_type, beta", [("dapo", 0.1), ("grpo", 0.0)])
def test_rollout_terms_reproduce_trls_step_gradient(tmp_path, cfg, base_model_dir, prompts, cpu, loss_type, beta):
    """Both the batched loss terms and the per-rollout gradients (captured in chunks of 5) add up to the
    gradient TRL clipped at each step."""
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
        assert within(rel, 1e-4), (step, rel)

        per_rollout = captured_gradients(
            model, ref, batch, loss_type, beta, grpo_cfg["temperature"], grpo_cfg["max_new_tokens"], chunk=5
        )
        summed = torch.cat([per_rollout[name].sum(0).flatten() for name, _ in model.named_parameters()])
        rel = ((summed - trl_grad).norm() / trl_grad.norm()).item()
        assert within(rel, 1e-4), (step, rel)


def test_captured_gradients_equal_one_backward_per_rollout(small_run, cpu):
    """Every rollout's captured gradient (KL term included) matches its own backward pass, block by block."""
    ref, _ = models.load(small_run["base_model"], cpu)
    model, tokenizer = models.load(small_run["dir"] / "train" / "checkpoint-2", cpu)
    batch = step_batch(small_run["rollouts"].filter(pl.col("step") == 3), tokenizer.pad_token_id)
    n, num_items = batch["advantages"].shape[0], int(batch["completion_mask"].sum())
    captured = captured_gradients(model, ref, batch, "dapo", 0.1, 1.0, 10, chunk=5)
    ref_logps = completion_logps(ref, batch, 1.0).detach()

    expected = {name: [] for name in captured}
    for i in range(n):
        model.zero_grad(set_to_none=True)
        row = rows_of(batch, i, i + 1)
        rollout_losses(
            completion_logps(model, row, 1.0), row, "dapo", 0.1, 10, ref_logps[i : i + 1], num_items=num_items, n_rows=n
        ).sum().backward()
        for name, p in model.named_parameters():
            expected[name].append(p.grad.clone())
    for name, grads in expected.items():
        want = torch.stack(grads)
        err = ((captured[name] - want).flatten(1).norm(dim=1) / want.flatten(1).norm(dim=1).clamp(min=1e-12)).max()
        assert within(err, 1e-5), (name, float(err))
