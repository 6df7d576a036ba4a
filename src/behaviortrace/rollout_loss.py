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

from .config import SKETCHABLE_LOSSES



def pad_batch(prompts: list[list[int]], completions: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """TRL's layout: prompts left-padded and completions right-padded to the widest of the batch."""
    p_width, c_width = max(map(len, prompts)), max(map(len, completions))
    return {
        "prompt_ids": torch.tensor([[pad_id] * (p_width - len(p)) + p for p in prompts]),
        "prompt_mask": torch.tensor([[0] * (p_width - len(p)) + [1] * len(p) for p in prompts]),
        "completion_ids": torch.tensor([c + [pad_id] * (c_width - len(c)) for c in completions]),
        "completion_mask": torch.tensor([[1] * len(c) + [0] * (c_width - len(c)) for c in completions]),
    }


def step_batch(rows: pl.DataFrame, pad_id: int) -> dict[str, torch.Tensor]:
    """Padded tensors for one step's rollouts, in rollout-id order."""
    rows = rows.sort("rollout_id")
    batch = pad_batch(rows["prompt_ids"].to_list(), rows["completion_ids"].to_list(), pad_id)
    batch["advantages"] = torch.tensor(rows["advantage"].to_list())
    return batch


def rows_of(batch: dict, start: int, stop: int) -> dict:
    return {k: v[start:stop] for k, v in batch.items()}


def batch_to(batch: dict, device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def completion_logits(model, batch: dict) -> torch.Tensor:
    """Logits that predict each completion token, [rows, completion width, vocab], in float32."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    return logits[:, -width - 1:-1].float()


def token_logps(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    return torch.gather(F.log_softmax(logits / temperature, dim=-1), 2, ids.unsqueeze(-1)).squeeze(-1)


def completion_logps(model, batch: dict, temperature: float) -> torch.Tensor:
    """Log-probs of the completion tokens, [rows, completion width], at the sampling temperature."""
    return token_logps(completion_logits(model, batch), batch["completion_ids"], temperature)


def fluency(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """Mean token log-prob of each completion under the model itself (temperature 1)."""
    mask = batch["completion_mask"].float()
    logps = token_logps(logits.detach(), batch["completion_ids"])
    return (logps * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def token_weights(loss_type: str, mask: torch.Tensor, n_rows: int, num_items: int, max_completion_length: int):
    """The coefficient TRL puts on each token's loss before summing, per loss type."""
    mask = mask.float()
    if loss_type == "dapo":
        return mask / num_items
    if loss_type == "grpo":
        return mask / mask.sum(-1, keepdim=True).clamp(min=1.0) / n_rows
    if loss_type == "bnpo":  # TRL divides by the batch's token count; one batch per step here
        return mask / num_items
    if loss_type == "dr_grpo":
        return mask / (n_rows * max_completion_length)
    raise ValueError(f"loss type {loss_type!r} is not supported for per-rollout gradients; use one of {SKETCHABLE_LOSSES}")


def rollout_losses(logps: torch.Tensor, batch: dict, loss_type: str, beta: float, max_completion_length: int,
                   ref_logps: torch.Tensor | None = None, num_items: int | None = None,
                   positions: torch.Tensor | None = None, n_rows: int | None = None) -> torch.Tensor:
    """One loss term per rollout; their sum is TRL's loss on the batch (on-policy, before clipping).

    `num_items` (token count) and `n_rows` (rollouts) describe the whole step, which TRL normalizes
    by; they default to the batch given here, so pass them when giving a slice of the step.
    `positions` (0/1 per completion token) keeps only the terms at those positions, normalized as in
    the full loss: the behavior-token share of the rollout's loss.
    """
    mask = batch["completion_mask"]
    ratio = torch.exp(logps - logps.detach())  # 1 in value; carries the gradient of the log-prob
    per_token = -ratio * batch["advantages"].unsqueeze(1)
    if beta:
        diff = ref_logps - logps
        # k3 estimator times the importance ratio (TRL's default use_bias_correction_kl=True).
        per_token = per_token + beta * (torch.exp(diff) - diff - 1) * ratio
    items = int(mask.sum()) if num_items is None else num_items
    rows = mask.shape[0] if n_rows is None else n_rows
    weights = token_weights(loss_type, mask, rows, max(items, 1), max_completion_length)
    if positions is not None:
        weights = weights * positions
    return (per_token * weights).sum(-1)
