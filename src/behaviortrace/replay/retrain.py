"""Leave-out replay: retrain a seed from its step-0 checkpoint on its logged rollouts, with a set of rollouts
left out, and measure the behavior it ends up with.

The replay repeats what TRL did at each step (trl 1.16, on-policy, one optimizer step per generation
batch): the same rollouts in the same order, the group advantages recomputed from the logged rewards, the same
per-token loss and normalization (train/trl_surface.py), the same optimizer, learning-rate schedule and
gradient clipping (built by transformers' own Trainer from the same arguments), and the same precision: the
forward and backward passes under bf16 autocast for compute.dtype bfloat16, the float32 weights updated outside
it (common/device.py). With nothing left out it reproduces the logged training's weights; a test checks that.

What leaving a rollout out means is `influence.semantics` (docs/influence.md), the same for every causal truth:
`advantages` drops it from its group as if it had never been sampled, its group's advantages recomputed from the
rewards left (TRL's NaN-aware group mean and std) and the step normalized as the kept batch; `held` zeroes its
own term only, every other rollout keeping the advantage and the step the normalization it had with nothing left
out. A test holds both to the exact influence's weighted step (influence/trajectory.py) at weight 0.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import polars as pl
import torch

from behaviortrace.common.device import autocast
from behaviortrace.config.sections import Grpo
from behaviortrace.gradients.batch import batch_to, completion_logps, pad_batch
from behaviortrace.model import models
from behaviortrace.train.trl_surface import group_advantages, optimizer_and_schedule, rollout_losses

log = logging.getLogger(__name__)


def replay_training(
    model,
    ref_model,
    rollouts: pl.DataFrame,
    grpo: Grpo,
    removed: set[int],
    device: dict,
    pad_id: int,
    on_step_end=None,
    stop_after: int | None = None,
    semantics: str = "advantages",
) -> dict:
    """Replay the logged steps on `model` (the step-0 weights) with `removed` rollout ids left out (with the
    meaning `semantics`), up to step `stop_after` (all of training when None).

    `on_step_end(step_done, model)` is called after each optimizer step (step_done = 1, 2, ...), for the
    behavior measurements. Returns per-step grad norms, for the faithfulness check.
    """
    optimizer, scheduler = optimizer_and_schedule(model, grpo, device)
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    by_step = rollouts.sort("rollout_id").partition_by("step", as_dict=True, maintain_order=True)
    grad_norms, started = [], time.time()
    n_steps = grpo.steps if stop_after is None else min(stop_after, grpo.steps)
    for step in range(n_steps):
        rows = by_step[(step,)]
        keep = ~rows["rollout_id"].is_in(list(removed)).to_numpy()
        counted = keep if semantics == "advantages" else np.ones(len(keep), bool)  # in the statistics and counts
        adv = group_advantages(rows["reward"].to_numpy(), rows["group_id"].to_numpy(), counted, grpo.scale_rewards)
        kept = rows.filter(pl.Series(keep))
        optimizer.zero_grad(set_to_none=False)
        if kept.height:
            batch = pad_batch(kept["prompt_ids"].to_list(), kept["completion_ids"].to_list(), pad_id)
            batch["advantages"] = torch.tensor(adv[keep], dtype=torch.float32)
            # Normalized as TRL normalizes the batch of the counted rollouts; without a KL term a rollout with
            # advantage 0 adds exactly nothing to the loss, so only the others go through the model (same padding).
            num_items = int(sum(len(c) for c, k in zip(rows["completion_ids"], counted, strict=True) if k))
            n_rows = int(counted.sum())
            if not grpo.beta:
                batch = {key: value[batch["advantages"] != 0] for key, value in batch.items()}
            batch = batch_to(batch, device["device"])
            if len(batch["advantages"]):
                with autocast(device):
                    logps = completion_logps(model, batch, grpo.temperature)
                    ref = None
                    if grpo.beta:
                        with torch.no_grad():
                            ref = completion_logps(ref_model, batch, grpo.temperature)
                    loss = rollout_losses(
                        logps,
                        batch,
                        grpo.loss_type,
                        grpo.beta,
                        grpo.max_new_tokens,
                        ref,
                        num_items=num_items,
                        n_rows=n_rows,
                    ).sum()
                    loss.backward()
        grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, grpo.max_grad_norm)))
        optimizer.step()
        scheduler.step()
        if on_step_end is not None:
            on_step_end(step + 1, model)
        if (step + 1) % 20 == 0 or step + 1 == n_steps:
            log.info(
                "replayed step %d/%d (%d of %d rollouts kept); %.1f s",
                step + 1,
                n_steps,
                kept.height,
                rows.height,
                time.time() - started,
            )
    return {"grad_norms": grad_norms}


def weight_difference(model, checkpoint: Path, device: dict) -> float:
    """Largest absolute difference between the model's weights and a saved checkpoint's."""

    saved = dict(models.load(checkpoint, device)[0].named_parameters())
    return max(float((p.detach() - saved[n].detach()).abs().max()) for n, p in model.named_parameters())


def update_error(model, checkpoint: Path, start: Path, device: dict) -> float:
    """||w - w_checkpoint|| / ||w_checkpoint - w_start||: how far the model is from a saved checkpoint, as a share
    of the update training made from `start` to it.

    The largest absolute difference is no measure of a replay's faithfulness that holds on every processor:
    AdamW divides by sqrt(v) + eps, so a gradient coordinate that nearly cancels turns a rounding difference of
    the processor's kernels into a weight difference of up to lr. Those coordinates are few, so the share of
    the whole update they make stays small, while any real difference to training moves most coordinates
    (docs/reruns.md)."""
    saved = dict(models.load(checkpoint, device)[0].named_parameters())
    first = dict(models.load(start, device)[0].named_parameters())
    error = update = 0.0
    for n, p in model.named_parameters():
        error += float((p.detach().double() - saved[n].detach().double()).pow(2).sum())
        update += float((saved[n].detach().double() - first[n].detach().double()).pow(2).sum())
    if update == 0:  # training never moved (no step had a gradient): faithful only if the replay did not either
        return 0.0 if error == 0 else float("inf")
    return (error / update) ** 0.5
