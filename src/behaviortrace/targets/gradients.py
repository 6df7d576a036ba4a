"""Behavior targets at one checkpoint for one generation draw, sketched with the run's map.

- in-context: sample completions for the probe prompts; the gradient of the log-prob of the marker
  tokens at the positions where they actually occur (mean over the samples that show it);
- forced: the gradient of the log-prob of the marker appended right after each probe prompt (mean
  over probes).

Both are gradients of log-probs (the direction that makes the behavior more likely), at the sampling
temperature, like the rollouts' loss. Rollout sketches hold loss gradients, so an update along a
rollout's gradient moves the target by minus their inner product; estimators apply that sign. The log-probs
and their gradient are computed by gradients/logprob.py.
"""

from __future__ import annotations

import torch

from behaviortrace.common.device import autocast
from behaviortrace.gradients.logprob import forced_items, logprob_gradient
from behaviortrace.plant.markers import marker_positions
from behaviortrace.sketch.maps import SketchMap


def in_context_items(
    prompt_ids: list[list[int]], samples: list[list[list[int]]], tokenizer, marker: str, marker_ids: list[int]
) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt ids, completion ids, marker positions) of every sample that holds the marker."""
    items = []
    for p, completions in zip(prompt_ids, samples, strict=False):
        for c in completions:
            positions = marker_positions(c, marker_ids, tokenizer, marker)
            if positions:
                items.append((p, c, positions))
    return items


def target_sketches(
    model,
    tokenizer,
    smap: SketchMap,
    prompt_ids: list[list[int]],
    samples: list[list[list[int]]],
    marker: str,
    marker_ids: list[int],
    temperature: float,
    chunk: int,
    denominator: dict[str, torch.Tensor] | None = None,
    device: dict | None = None,
) -> dict:
    """Sketches and exact norms of the in-context and forced targets, with their items; an empty in-context set
    gives zeros.

    With `denominator` (AdamW's per-coordinate divisor at this checkpoint, train/optimizer_log.py), also
    the sketch of the target gradient divided by it (`adam_sketch`; zeros without one): Adam's diagonal
    preconditioner applied exactly, on the dense gradient, before sketching. <S(P grad f), S g> then
    estimates <grad f, P g>, the first-order effect on f of an update along P g (estimators/adam_tracin.py).

    The gradients are taken in `device`'s precision (common/device.py: under bf16 autocast for compute.dtype
    bfloat16, as training's were); the sketch map's arithmetic stays outside autocast.
    """
    items = {
        "in_context": in_context_items(prompt_ids, samples, tokenizer, marker, marker_ids),
        "forced": forced_items(prompt_ids, marker_ids),
    }
    return {
        kind: items_sketch(model, tokenizer, smap, its, temperature, chunk, denominator, device)
        for kind, its in items.items()
    }


def items_sketch(
    model,
    tokenizer,
    smap: SketchMap,
    items: list[tuple[list[int], list[int], list[int]]],
    temperature: float,
    chunk: int,
    denominator: dict[str, torch.Tensor] | None = None,
    device: dict | None = None,
) -> dict:
    """One target from its items (prompt ids, completion ids, scored positions): the sketch and exact norm of the
    gradient of their mean log-prob, and with `denominator` its sketch divided by it (see `target_sketches`);
    zeros for no items. A target of your own (api.py) is made here too."""
    zeros = torch.zeros(smap.k, device=smap.device)
    if items:
        with autocast(device or {"dtype": "float32"}):
            grads = logprob_gradient(model, tokenizer, items, temperature, chunk)
        sketch, sq = smap.sketch_dense(grads)
    else:
        grads, sketch, sq = None, zeros, 0.0
    adam = zeros
    if grads and denominator is not None:
        adam = smap.sketch_dense({n: g / denominator[n] for n, g in grads.items()})[0]
    return {
        "sketch": sketch.cpu().numpy(),
        "norm": sq**0.5,
        "n": len(items),
        "adam_sketch": adam.cpu().numpy(),
        "items": items,
    }
