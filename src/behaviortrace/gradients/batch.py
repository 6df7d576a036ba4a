"""A step's rollouts as model inputs, and the log-probs the per-rollout losses are built from.

Rebuilds TRL's batch layout from the rollout log (prompts left-padded and completions right-padded to
the widest in the step, as TRL pads the whole generation batch) and recomputes the per-token log-probs
at the sampling temperature. TRL's loss itself, split per rollout, is in train/trl_surface.py.
"""

from __future__ import annotations

import polars as pl
import torch
import torch.nn.functional as F


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
    """Logits that predict each completion token, [rows, completion width, vocab], in float32 (float64 for a
    float64 model)."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    logits = logits[:, -width - 1 : -1]
    return logits if logits.dtype == torch.float64 else logits.float()


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
