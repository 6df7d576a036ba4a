"""Sketch every rollout of a step: its share of TRL's loss, differentiated at the generating checkpoint.

Per rollout: the sketch of its full gradient (before clipping), the exact norm, fluency, and the
sketch of the behavior-token share (the loss terms at the marker's positions only; zero and flagged
where the completion holds no marker token).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import torch

from .markers import marker_positions
from .pergrad import Capture
from .rollout_loss import (batch_to, completion_logits, fluency, rollout_losses, rows_of, step_batch,
                           token_logps)
from .sketchmap import SketchMap


class StepSketcher:
    """Holds what every step needs: the sketch map, the reference model for KL, the loss settings."""

    def __init__(self, smap: SketchMap, grpo: dict, tokenizer, marker: str, marker_ids: list[int],
                 ref_model=None, chunk: int = 64):
        self.smap, self.grpo, self.tokenizer = smap, grpo, tokenizer
        self.marker, self.marker_ids = marker, marker_ids
        self.ref_model, self.chunk = ref_model, chunk
        if grpo["beta"] and ref_model is None:
            raise ValueError("grpo.beta > 0: the KL term needs the reference (base) model")

    def _losses(self, model, batch: dict, n_rows: int, num_items: int, positions=None):
        logits = completion_logits(model, batch)
        logps = token_logps(logits, batch["completion_ids"], self.grpo["temperature"])
        ref = None
        if self.grpo["beta"]:
            with torch.no_grad():
                ref = token_logps(completion_logits(self.ref_model, batch), batch["completion_ids"],
                                  self.grpo["temperature"])
        losses = rollout_losses(logps, batch, self.grpo["loss_type"], self.grpo["beta"], self.grpo["max_new_tokens"],
                                ref, num_items=num_items, positions=positions, n_rows=n_rows)
        return losses, logits

    def _sketch(self, model, batch, n_rows, num_items, positions=None):
        with Capture(model) as cap:
            losses, logits = self._losses(model, batch, n_rows, num_items, positions)
            losses.sum().backward()
            grads = cap.finish()
        sketch, sq = self.smap.sketch_examples(grads)
        return sketch, sq, logits

    def positions(self, rows: pl.DataFrame, width: int) -> torch.Tensor:
        """0/1 mask of marker-token positions, [rows, width]."""
        mask = torch.zeros(rows.height, width)
        for i, ids in enumerate(rows["completion_ids"].to_list()):
            for t in marker_positions(ids, self.marker_ids, self.tokenizer, self.marker):
                mask[i, t] = 1.0
        return mask

    def sketch_step(self, model, rows: pl.DataFrame, num_items: int) -> dict[str, np.ndarray]:
        """Arrays for one step's rollouts, in rollout-id order."""
        rows = rows.sort("rollout_id")
        device = self.smap.device
        full = batch_to(step_batch(rows, self.tokenizer.pad_token_id), device)
        n = rows.height
        positions = self.positions(rows, full["completion_ids"].shape[1]).to(device)
        has_marker = positions.sum(1) > 0
        out = {"sketch": torch.zeros(n, self.smap.k), "behavior_sketch": torch.zeros(n, self.smap.k),
               "norm": torch.zeros(n, dtype=torch.float64), "behavior_norm": torch.zeros(n, dtype=torch.float64),
               "fluency": torch.zeros(n)}
        model.eval()
        for start in range(0, n, self.chunk):
            stop = min(n, start + self.chunk)
            batch = rows_of(full, start, stop)
            sketch, sq, logits = self._sketch(model, batch, n, num_items)
            out["sketch"][start:stop] = sketch.cpu()
            out["norm"][start:stop] = sq.double().sqrt().cpu()
            out["fluency"][start:stop] = fluency(logits, batch).cpu()
            marked = torch.nonzero(has_marker[start:stop]).flatten()
            if len(marked):
                sub = {k: v[marked] for k, v in batch.items()}
                sub_pos = positions[start:stop][marked]
                b_sketch, b_sq, _ = self._sketch(model, sub, n, num_items, sub_pos)
                idx = (marked + start).cpu()
                out["behavior_sketch"][idx] = b_sketch.cpu()
                out["behavior_norm"][idx] = b_sq.double().sqrt().cpu()
        arrays = {k: v.numpy() for k, v in out.items()}
        arrays["has_marker"] = has_marker.cpu().numpy()
        return arrays

    def step_gradient_sketch(self, model, rows: pl.DataFrame, num_items: int) -> tuple[torch.Tensor, float]:
        """Sketch of the step's summed gradient by ordinary autograd: an independent check of the sum."""
        rows = rows.sort("rollout_id")
        batch = batch_to(step_batch(rows, self.tokenizer.pad_token_id), self.smap.device)
        model.zero_grad(set_to_none=True)
        losses, _ = self._losses(model, batch, rows.height, num_items)
        losses.sum().backward()
        grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p))
                 for n, p in model.named_parameters() if p.requires_grad}
        model.zero_grad(set_to_none=True)
        return self.smap.sketch_dense(grads)
