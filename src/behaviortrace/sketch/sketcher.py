"""Sketch every rollout of a step: its share of TRL's loss, differentiated at the generating checkpoint.

Per rollout: the sketch of its full gradient (before clipping), the exact norm, fluency, and the
sketch of the behavior-token share (the loss terms at the marker's positions only; zero and flagged
where the completion holds no marker token). For the token-level null, the same share at as many
randomly chosen non-marker positions of the same completion (seeded by sketch seed and rollout id).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import torch

from behaviortrace.common.device import autocast
from behaviortrace.config.sections import Grpo
from behaviortrace.gradients.batch import batch_to, completion_logits, fluency, step_batch, token_logps
from behaviortrace.gradients.per_example import Capture, accumulated_grads
from behaviortrace.plant.markers import marker_positions
from behaviortrace.sketch.maps import SketchMap
from behaviortrace.train.trl_surface import rollout_losses

FLOAT32 = {"dtype": "float32"}  # a device dict's precision without autocast (common/device.py)


def check_step_sum(sketches: np.ndarray, reference: torch.Tensor, against: str, tolerance: float) -> float:
    """Relative error of a step's summed rollout sketches against the sketch of the step's gradient
    (`against` names that gradient). Above `tolerance` (sketch/tolerance.py, of the run's compute.dtype) some use
    of a parameter escaped the per-example capture, and sketching stops.

    The error is measured against the larger of the step gradient and `tolerance` times the summed norms of the
    rollouts' sketches: where the rollouts cancel (identical completions paid differently, with opposite
    advantages), the step gradient is rounding noise of that size, which no capture can match relatively."""
    rel = step_sum_error(sketches, reference, tolerance)
    if rel > tolerance:
        raise RuntimeError(
            f"per-rollout sketches do not add up to {against} (relative error {rel:.2e}, tolerance {tolerance:.1e}); "
            "some parameter's use escapes the per-example capture"
        )
    return rel


def step_sum_error(sketches: np.ndarray, reference: torch.Tensor, floor: float) -> float:
    """`check_step_sum`'s relative error, measured against the larger of the step gradient's sketch and `floor`
    times the summed norms of the rollouts' sketches."""
    rows = np.asarray(sketches, dtype=np.float64)
    total = rows.sum(0)
    ref = reference.detach().double().cpu().numpy().ravel()
    scale = max(float(np.linalg.norm(ref)), floor * float(np.linalg.norm(rows, axis=1).sum()), 1e-30)
    return float(np.linalg.norm(total - ref) / scale)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: well-spread 64-bit hashes of 64-bit inputs, vectorized."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(0xFFFFFFFFFFFFFFFF)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class StepSketcher:
    """Holds what every step needs: the sketch map, the reference model for KL, the loss settings, and the job's
    device (common/device.py), whose precision the model's forward passes run in: under bf16 autocast for
    compute.dtype bfloat16, as TRL's were. The sketch map's arithmetic stays outside autocast."""

    def __init__(
        self,
        smap: SketchMap,
        grpo: Grpo,
        tokenizer,
        marker: str,
        marker_ids: list[int],
        ref_model=None,
        chunk: int = 64,
        device: dict = FLOAT32,
    ):
        self.smap, self.grpo, self.tokenizer = smap, grpo, tokenizer
        self.marker, self.marker_ids = marker, marker_ids
        self.ref_model, self.chunk, self.job_device = ref_model, chunk, device
        if grpo.beta and ref_model is None:
            raise ValueError("grpo.beta > 0: the KL term needs the reference (base) model")

    def _logps(self, model, batch: dict):
        """Logits, token log-probs and the reference model's token log-probs (None without a KL term)."""
        with autocast(self.job_device):
            logits = completion_logits(model, batch)
            logps = token_logps(logits, batch["completion_ids"], self.grpo.temperature)
            ref = None
            if self.grpo.beta:
                with torch.no_grad():
                    ref = token_logps(
                        completion_logits(self.ref_model, batch), batch["completion_ids"], self.grpo.temperature
                    )
        return logits, logps, ref

    def _losses(self, logps, ref, batch: dict, n_rows: int, num_items: int, positions=None):
        return rollout_losses(
            logps,
            batch,
            self.grpo.loss_type,
            self.grpo.beta,
            self.grpo.max_new_tokens,
            ref,
            num_items=num_items,
            positions=positions,
            n_rows=n_rows,
        )

    def sketch_batch(self, model, batch: dict, n_rows: int, num_items: int, masks=(None,)):
        """Per mask, sketches [rows, k] and squared norms [rows] of a slice of a step (normalized as the whole
        step), and the logits. A mask (0/1 per completion token) keeps the loss terms at its positions only;
        None keeps all. One forward pass serves every mask: each gets a backward pass of its own."""
        with Capture(model) as cap:
            logits, logps, ref = self._logps(model, batch)
            for i, positions in enumerate(masks):
                if i:
                    cap.next_backward()
                losses = self._losses(logps, ref, batch, n_rows, num_items, positions)
                losses.sum().backward(retain_graph=i < len(masks) - 1)
            per_mask = cap.finish_all()
        return [self.smap.sketch_examples(grads) for grads in per_mask], logits

    def positions(self, rows: pl.DataFrame, width: int) -> torch.Tensor:
        """0/1 mask of marker-token positions, [rows, width]."""
        mask = torch.zeros(rows.height, width)
        for i, ids in enumerate(rows["completion_ids"].to_list()):
            for t in marker_positions(ids, self.marker_ids, self.tokenizer, self.marker):
                mask[i, t] = 1.0
        return mask

    def null_positions(
        self, rows: pl.DataFrame, positions: torch.Tensor, completion_mask: torch.Tensor
    ) -> torch.Tensor:
        """As many random non-marker completion positions as each row has marker positions: those with the
        smallest random keys, each key a hash of (sketch seed, rollout id, position), so a rollout's null
        positions do not depend on which rows share its batch."""
        ids = rows["rollout_id"].to_numpy().astype(np.uint64)[:, None]
        where = np.arange(positions.shape[1], dtype=np.uint64)[None, :]
        keys = torch.from_numpy(_mix(_mix(np.uint64(self.smap.seed) ^ ids) ^ where).astype(np.float64))
        free = (completion_mask > 0) & (positions == 0)
        rank = keys.masked_fill(~free, float("inf")).argsort(1).argsort(1)  # 0 = the smallest key of the row
        wanted = positions.sum(1, keepdim=True).long()
        return ((rank < wanted) & free).to(positions.dtype)

    def sketch_step(self, model, rows: pl.DataFrame, num_items: int, recorded=None) -> dict[str, np.ndarray]:
        """Arrays for one step's rollouts, in rollout-id order.

        `recorded` (sketch/loss_pass.RecordedStep): the full gradients and fluency were read off TRL's own
        loss pass, so only the behavior and null shares need passes of their own."""
        rows = rows.sort("rollout_id")
        device = self.smap.device
        full = batch_to(step_batch(rows, self.tokenizer.pad_token_id), device)
        n = rows.height
        positions = self.positions(rows, full["completion_ids"].shape[1]).to(device)
        null = self.null_positions(rows, positions.cpu(), full["completion_mask"].cpu()).to(device)
        has_marker = positions.sum(1) > 0
        # Without a KL term a rollout with advantage 0 has a loss share of exactly 0: its sketches and
        # norms stay zero and only its fluency needs the model (a forward pass without gradients).
        moved = (full["advantages"] != 0) | bool(self.grpo.beta)
        out = {name: torch.zeros(n, self.smap.k) for name in ("sketch", "behavior_sketch", "null_sketch")}
        out.update({name: torch.zeros(n, dtype=torch.float64) for name in ("norm", "behavior_norm", "null_norm")})
        out["fluency"] = torch.zeros(n)
        if recorded is not None:  # its rows are in TRL's order; recorded.rows puts them in rollout-id order
            order = recorded.rows.cpu()
            out["fluency"][order] = recorded.fluency.float().cpu()
            active = torch.nonzero(moved.cpu()[order]).flatten()  # rows whose loss share is not exactly zero
            for rows in active.split(self.chunk) if len(active) else ():  # a step of ties: nothing moved
                sketch, sq = self.smap.sketch_examples(recorded.select(rows.to(device)))
                out["sketch"][order[rows]], out["norm"][order[rows]] = sketch.cpu(), sq.double().sqrt().cpu()
        model.eval()
        if recorded is None:
            for start in range(0, n, self.chunk):
                stop = min(n, start + self.chunk)
                chunk = {key: value[start:stop] for key, value in full.items()}
                self._full_shares(model, chunk, moved[start:stop], start, n, num_items, out)
        # A marked rollout's factors are kept twice (marker positions, null positions): chunk // 2 per pass.
        marked = torch.nonzero(has_marker & moved).flatten()
        per_pass = max(1, self.chunk // 2)
        for first in range(0, len(marked), per_pass):
            self._behavior_shares(model, full, positions, null, marked[first : first + per_pass], n, num_items, out)
        arrays = {k: v.numpy() for k, v in out.items()}
        arrays["has_marker"] = has_marker.cpu().numpy()
        return arrays

    def _full_shares(self, model, chunk: dict, moved, start: int, n: int, num_items: int, out: dict) -> None:
        """Full-gradient sketches, norms and fluency of one chunk of a step's rollouts."""
        active = torch.nonzero(moved).flatten()
        idle = torch.nonzero(~moved).flatten()
        if len(idle):
            batch = {key: value[idle] for key, value in chunk.items()}
            with torch.no_grad(), autocast(self.job_device):
                out["fluency"][(idle + start).cpu()] = fluency(completion_logits(model, batch), batch).cpu()
        if not len(active):
            return
        rows = (active + start).cpu()
        batch = {key: value[active] for key, value in chunk.items()}
        [(sketch, sq)], logits = self.sketch_batch(model, batch, n, num_items)
        out["sketch"][rows] = sketch.cpu()
        out["norm"][rows] = sq.double().sqrt().cpu()
        out["fluency"][rows] = fluency(logits, batch).cpu()

    def _behavior_shares(self, model, full: dict, positions, null, marked, n: int, num_items: int, out: dict) -> None:
        """Marker-position and null-position shares of some marked rollouts, from one forward pass."""
        sub = {k: v[marked] for k, v in full.items()}
        shares, _ = self.sketch_batch(model, sub, n, num_items, (positions[marked], null[marked]))
        idx = marked.cpu()
        for (sketch, sq), name in zip(shares, ("behavior", "null"), strict=True):
            out[f"{name}_sketch"][idx], out[f"{name}_norm"][idx] = sketch.cpu(), sq.double().sqrt().cpu()

    def step_gradient_sketch(self, model, rows: pl.DataFrame, num_items: int) -> tuple[torch.Tensor, float]:
        """Sketch of the step's summed gradient by ordinary autograd: an independent check of the sum."""
        rows = rows.sort("rollout_id")
        batch = batch_to(step_batch(rows, self.tokenizer.pad_token_id), self.smap.device)
        model.zero_grad(set_to_none=True)
        _, logps, ref = self._logps(model, batch)
        self._losses(logps, ref, batch, rows.height, num_items).sum().backward()
        sketch = self.smap.sketch_dense(accumulated_grads(model))
        model.zero_grad(set_to_none=True)
        return sketch
