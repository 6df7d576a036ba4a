"""Each rollout's share of the loss TRL optimized at its step, so per-rollout gradients sum to the step's.

Rebuilds TRL's batch layout from the rollout log (prompts left-padded and completions right-padded to
the widest in the step, as TRL pads the whole generation batch), recomputes the per-token log-probs at
the sampling temperature, and splits TRL's loss (trl 1.16, on-policy: importance ratio 1) into one
term per rollout. Groundwork for the sketch stage: gradients of these terms are what gets sketched.
"""

from __future__ import annotations

import polars as pl
import torch
import torch.nn.functional as F

SUPPORTED_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo")


def step_batch(rows: pl.DataFrame, pad_id: int) -> dict[str, torch.Tensor]:
    """Padded tensors for one step's rollouts, in rollout-id order."""
    rows = rows.sort("rollout_id")
    prompts = rows["prompt_ids"].to_list()
    completions = rows["completion_ids"].to_list()
    p_width, c_width = max(map(len, prompts)), max(map(len, completions))
    prompt_ids = torch.tensor([[pad_id] * (p_width - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[0] * (p_width - len(p)) + [1] * len(p) for p in prompts])
    completion_ids = torch.tensor([c + [pad_id] * (c_width - len(c)) for c in completions])
    completion_mask = torch.tensor([[1] * len(c) + [0] * (c_width - len(c)) for c in completions])
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": torch.tensor(rows["advantage"].to_list())}


def completion_logps(model, batch: dict, temperature: float) -> torch.Tensor:
    """Log-probs of the completion tokens, [rows, completion width], at the sampling temperature."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    logits = logits[:, -width - 1:-1].float() / temperature
    return torch.gather(F.log_softmax(logits, dim=-1), 2, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


def token_weights(loss_type: str, mask: torch.Tensor, n_rows: int, num_items: int, max_completion_length: int):
    """The coefficient TRL puts on each token's loss before summing, per loss type."""
    mask = mask.float()
    if loss_type == "dapo":
        return mask / num_items
    if loss_type == "grpo":
        return mask / mask.sum(-1, keepdim=True).clamp(min=1.0) / n_rows
    if loss_type == "bnpo":
        return mask / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return mask / (n_rows * max_completion_length)
    raise ValueError(f"loss type {loss_type!r} is not supported for per-rollout gradients; use one of {SUPPORTED_LOSSES}")


def rollout_losses(logps: torch.Tensor, batch: dict, loss_type: str, beta: float, max_completion_length: int,
                   ref_logps: torch.Tensor | None = None, num_items: int | None = None) -> torch.Tensor:
    """One loss term per rollout; their sum is TRL's loss on the batch (on-policy, before clipping).

    `num_items` is the token count of the whole generation batch (dapo's normalizer); by default the
    batch given here, which is the whole step.
    """
    mask = batch["completion_mask"]
    ratio = torch.exp(logps - logps.detach())  # 1 in value; carries the gradient of the log-prob
    per_token = -ratio * batch["advantages"].unsqueeze(1)
    if beta:
        diff = ref_logps - logps
        # k3 estimator times the importance ratio (TRL's default use_bias_correction_kl=True).
        per_token = per_token + beta * (torch.exp(diff) - diff - 1) * ratio
    items = int(mask.sum()) if num_items is None else num_items
    weights = token_weights(loss_type, mask, mask.shape[0], max(items, 1), max_completion_length)
    return (per_token * weights).sum(-1)
