"""The mean log-prob of chosen completion tokens over a set of items, and its gradient.

An item is (prompt ids, completion ids, positions); the function is the mean over items of the summed log-probs
of the completion tokens at `positions`, at the sampling temperature. Its gradient is what the targets stage
sketches (targets/gradients.py), the function itself what the measured effect measures at every training
step (train/effect.py), and both make the objective of the exact influence (influence/objective.py).
"""

from __future__ import annotations

import torch

from behaviortrace.gradients.batch import batch_to, completion_logits, pad_batch, token_logps
from behaviortrace.gradients.per_example import accumulated_grads


def _logprob_sums(model, tokenizer, items, temperature: float, chunk: int):
    """Per chunk of items: sum over items of sum_{t in positions} log p(completion_t), as a scalar tensor."""
    device = next(model.parameters()).device
    for start in range(0, len(items), chunk):
        part = items[start : start + chunk]
        batch = batch_to(pad_batch([p for p, _, _ in part], [c for _, c, _ in part], tokenizer.pad_token_id), device)
        mask = torch.zeros_like(batch["completion_ids"], dtype=torch.float32)
        for i, (_, _, positions) in enumerate(part):
            mask[i, positions] = 1.0
        logps = token_logps(completion_logits(model, batch), batch["completion_ids"], temperature)
        yield (logps * mask).sum()


def logprob_gradient(
    model, tokenizer, items: list[tuple[list[int], list[int], list[int]]], temperature: float, chunk: int
) -> dict[str, torch.Tensor]:
    """Gradient of the mean over items of sum_{t in positions} log p(completion_t), per parameter."""
    model.zero_grad(set_to_none=True)
    model.eval()
    for part_sum in _logprob_sums(model, tokenizer, items, temperature, chunk):
        (part_sum / len(items)).backward()
    grads = {n: g.clone() for n, g in accumulated_grads(model).items()}
    model.zero_grad(set_to_none=True)
    return grads


def mean_logprob(model, tokenizer, items, temperature: float, chunk: int) -> float:
    """The function whose gradient `logprob_gradient` takes, evaluated (no gradient, `.grad` untouched);
    the model's train/eval mode is restored."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        total = sum(float(s.double()) for s in _logprob_sums(model, tokenizer, items, temperature, chunk))
    model.train(was_training)
    return total / len(items)


def forced_items(prompt_ids: list[list[int]], marker_ids: list[int]) -> list[tuple[list[int], list[int], list[int]]]:
    return [(p, list(marker_ids), list(range(len(marker_ids)))) for p in prompt_ids]
