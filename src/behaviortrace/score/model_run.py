"""The inputs of an estimator that needs the model (score/contract.py, `NEEDS_MODEL`): one seed's rollout log,
its training checkpoints, each rollout's loss, and the probe targets as functions of the weights.

A rollout's loss is its share of TRL's GRPO loss at the step that generated it, with its logged advantage and the
step's normalization (train/trl_surface.py), so every method attributes the objective training optimized. Only
saved checkpoints exist, so a model estimator evaluates a rollout at the checkpoint at or before the step that
generated it (`checkpoint_step`), as TracInCP does; the sketch-based estimators have each step's exact weights.

A target is the function whose gradient the targets stage sketched (targets/gradients.py): the mean over items of
the summed log-probs of the marker tokens, at the sampling temperature. The forced target's items are the probe
prompts with the marker appended; the in-context target's are the draw's sampled completions that show the marker,
saved by the targets job at each analysis checkpoint.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import polars as pl
import torch

from behaviortrace.common import device as devices
from behaviortrace.common.device import autocast
from behaviortrace.config.sections import Config
from behaviortrace.gradients.batch import pad_batch, token_logps
from behaviortrace.gradients.logprob import forced_items
from behaviortrace.model import models
from behaviortrace.model.prompt_format import prompt_ids as formatted_ids
from behaviortrace.plant.markers import marker_token_ids
from behaviortrace.targets.items import load_items
from behaviortrace.train.checkpoints import read_manifest
from behaviortrace.train.trl_surface import rollout_losses, token_weights

LOG_COLUMNS = [
    "rollout_id",
    "step",
    "group_id",
    "advantage",
    "lr",
    "checkpoint_step",
    "prompt_ids",
    "completion_ids",
]

log = logging.getLogger(__name__)


class ModelRun:
    """One seed: the rollout log in rollout-id order, its checkpoints, and each rollout's loss at given weights."""

    def __init__(self, cfg: Config, rollouts: Path, checkpoints: Path, base_model: Path, scratch: Path):
        self.grpo = cfg.grpo
        self.device = devices.resolve(cfg.compute)
        self.checkpoints, self.second_moments = read_manifest(checkpoints)
        self.base_model = Path(base_model)
        self.scratch = Path(scratch)  # a folder the job deletes afterwards, for a library's own files
        self.rollouts = with_step_shapes(pl.read_parquet(rollouts, columns=LOG_COLUMNS))
        self._ref = None
        self.pad_id = models.load_tokenizer(self.base_model).pad_token_id  # training padded with the base's

    def without_autocast(self) -> ModelRun:
        """This run with its losses taken in float32 where training ran under bf16 autocast (the weights are float32
        either way): for a library whose hooks cannot mix bf16 activations with float32 gradients."""
        other = copy.copy(self)
        other.device = {**self.device, "dtype": "float32"}
        return other

    def load(self, step: int):
        """The model (train mode off) and tokenizer at checkpoint `step`."""
        model, tokenizer = models.load(self.checkpoints[step], self.device)
        return model.eval(), tokenizer

    def adam_denominator(self, step: int) -> dict[str, torch.Tensor]:
        """AdamW's per-coordinate divisor sqrt(v / (1 - beta2^n)) + eps of each parameter, from its second moment
        saved right after the update of step `step` (train/optimizer_log.py)."""
        from behaviortrace.train.optimizer_log import denominator, load_preconditioner

        if step not in self.second_moments:
            raise FileNotFoundError(f"training saved no AdamW second moment at checkpoint {step}")
        return denominator(load_preconditioner(self.second_moments[step]))

    @staticmethod
    def linear_modules(model) -> list[str]:
        """The names of the model's linear layers with trainable weights of their own (see `linear_modules`)."""
        return linear_modules(model)

    def checkpoint_rows(self) -> list[tuple[int, np.ndarray]]:
        """(checkpoint, mask) for each checkpoint that has rollouts to score: those evaluated there
        (`checkpoint_step`) whose loss has a gradient (a nonzero advantage, or any rollout under a KL term)."""
        checkpoint = self.rollouts["checkpoint_step"].to_numpy()
        used = self.rollouts["advantage"].to_numpy() != 0 if not self.grpo.beta else np.ones(len(checkpoint), bool)
        masks = [(int(c), (checkpoint == c) & used) for c in np.unique(checkpoint)]
        return [(c, mask) for c, mask in masks if mask.any()]

    def score_per_checkpoint(self, target, name: str, values) -> np.ndarray:
        """Every rollout's score, one checkpoint at a time (the loop of each estimator that needs the model): for the
        rollouts to score at checkpoint c (`checkpoint_rows`) and the target's checkpoint `at` for it,
        `values(c, mask, at)` is their attribution value, whose negative is the score (a rollout's gradient is its
        loss's, so a descent step along it moves f by minus their product); 0 where the target has no items at
        `at` (an in-context target no sample showed) and for rollouts without a gradient."""
        out = np.zeros(self.rollouts.height)
        for c, mask in self.checkpoint_rows():
            at = target.step_for(c)
            if not target.items[at]:
                continue
            out[mask] = -values(c, mask, at)
            log.info("%s: checkpoint %d, %d rollouts scored against the target at %d", name, c, mask.sum(), at)
        return out

    def rows(self, mask: np.ndarray | None = None) -> list[dict]:
        """Rollouts as dicts (for a library's dataset), optionally only those where `mask` holds."""
        log = self.rollouts if mask is None else self.rollouts.filter(pl.Series(mask))
        return log.to_dicts()

    def batch(self, rows: list[dict]) -> dict:
        """Model inputs of any rollouts: each keeps the token positions it had in its step's padded batch (TRL's
        layout: prompts left-padded to the step's widest), so its loss is the one training computed."""
        batch = pad_batch([r["prompt_ids"] for r in rows], [r["completion_ids"] for r in rows], self.pad_id)
        width = batch["prompt_ids"].shape[1]
        total = width + batch["completion_ids"].shape[1]
        shift = torch.tensor([width - r["prompt_width"] for r in rows]).unsqueeze(1)
        batch["position_ids"] = (torch.arange(total).unsqueeze(0) - shift).clamp(min=0)
        batch["advantages"] = torch.tensor([r["advantage"] for r in rows], dtype=torch.float32)
        batch["step"] = torch.tensor([r["step"] for r in rows])
        batch["num_items"] = torch.tensor([r["num_items"] for r in rows])
        batch["n_rows"] = torch.tensor([r["n_rows"] for r in rows])
        return batch

    def losses(self, model, batch: dict) -> torch.Tensor:
        """[rows] each rollout's share of its step's GRPO loss at the model's weights (logged advantage)."""
        device = next(model.parameters()).device
        batch = {k: v.to(device) for k, v in batch.items()}
        logps = logprobs(model, batch, self.grpo.temperature, self.device, batch["position_ids"])
        batch["advantages"] = batch["advantages"].to(logps.dtype)
        ref = self._ref_logps(batch, device) if self.grpo.beta else None
        out = torch.empty(len(logps), dtype=logps.dtype, device=device)
        for step in batch["step"].unique().tolist():
            rows = batch["step"] == step
            part = {k: v[rows] for k, v in batch.items()}
            out[rows] = rollout_losses(
                logps[rows],
                part,
                self.grpo.loss_type,
                self.grpo.beta,
                self.grpo.max_new_tokens,
                None if ref is None else ref[rows],
                num_items=int(part["num_items"][0]),
                n_rows=int(part["n_rows"][0]),
            )
        return out

    def token_weights(self, batch: dict) -> torch.Tensor:
        """[rows, completion width] the coefficient TRL puts on each token's loss term, each row normalized as its
        own step (for a library that builds the loss itself)."""
        mask = batch["completion_mask"]
        out = torch.empty(mask.shape, dtype=torch.float32)
        for step in batch["step"].unique().tolist():
            rows = batch["step"] == step
            n_rows, num_items = int(batch["n_rows"][rows][0]), int(batch["num_items"][rows][0])
            out[rows] = token_weights(
                self.grpo.loss_type, mask[rows], n_rows, max(num_items, 1), self.grpo.max_new_tokens
            )
        return out

    def reference_logps(self, batch: dict) -> torch.Tensor:
        """The base model's completion log-probs, which the KL term compares against."""
        return self._ref_logps(batch, torch.device(self.device["device"])).cpu()

    def _ref_logps(self, batch: dict, device) -> torch.Tensor:
        if self._ref is None:
            self._ref = models.load(self.base_model, self.device)[0].eval()
        batch = {k: v.to(device) for k, v in batch.items()}
        with torch.no_grad():
            return logprobs(self._ref, batch, self.grpo.temperature, self.device, batch["position_ids"])


def with_step_shapes(log: pl.DataFrame) -> pl.DataFrame:
    """A rollout log (LOG_COLUMNS) in rollout-id order, with each row's step shape: its widest prompt
    (`prompt_width`), its completion tokens (`num_items`) and its rollouts (`n_rows`)."""
    log = log.sort("rollout_id")
    widths = log.group_by("step").agg(
        pl.col("prompt_ids").list.len().max().alias("prompt_width"),
        pl.col("completion_ids").list.len().sum().alias("num_items"),
        pl.len().alias("n_rows"),
    )
    return log.join(widths, on="step", how="left", maintain_order="left")


def logprobs(model, batch: dict, temperature: float, device: dict, position_ids=None) -> torch.Tensor:
    """[rows, completion width] log-probs of the completion tokens (float32), in the run's precision."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].shape[1]
    with autocast(device):
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    logits = out.logits[:, -width - 1 : -1]
    logits = logits if logits.dtype == torch.float64 else logits.float()
    return token_logps(logits, batch["completion_ids"], temperature)


def linear_modules(model) -> list[str]:
    """The linear layers with trainable weights of their own: nn.Linear and its subclasses (x W^T + b) and
    transformers' Conv1D (x W + b, GPT-2's). A weight tied to another module (an output layer that shares the
    embedding) gets gradient from both uses, and a library that hooks modules would see one use of it."""
    from transformers.pytorch_utils import Conv1D

    uses = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear | Conv1D) and module.weight.requires_grad and uses[id(module.weight)] == 1
    ]


@dataclass(frozen=True)
class ModelTarget:
    """One kind of target of one draw: its items at each analysis checkpoint, and f as a function of the model."""

    kind: str
    draw: int
    checkpoint_steps: np.ndarray
    items: dict[int, list]  # analysis checkpoint -> [(prompt ids, completion ids, positions)]
    temperature: float
    chunk: int
    device: dict

    @classmethod
    def load(cls, cfg: Config, kind: str, draw: int, store: Path, probes: Path, run: ModelRun) -> ModelTarget:
        import zarr

        group = zarr.open_group(store, mode="r")
        if not group.attrs.get("complete"):
            raise RuntimeError(f"target store {store} is not complete; rerun its targets job")
        steps = group["checkpoint_step"][:]
        if kind == "forced":
            tokenizer = models.load_tokenizer(run.checkpoints[int(steps[0])])
            prompts = formatted_ids(tokenizer, pl.read_parquet(probes)["prompt"].to_list())
            forced = forced_items(prompts, marker_token_ids(tokenizer, cfg.planting.marker))
            items = {int(s): forced for s in steps}
        else:
            items = load_items(store, [int(s) for s in steps])
        return cls(kind, draw, steps, items, cfg.grpo.temperature, cfg.sketch.chunk_rollouts, run.device)

    def without_autocast(self) -> ModelTarget:
        """This target with f taken in float32 (as `ModelRun.without_autocast`)."""
        return replace(self, device={**self.device, "dtype": "float32"})

    def step_for(self, checkpoint_step: int) -> int:
        """The analysis checkpoint at or before `checkpoint_step` (the one the sketch estimators use too)."""
        earlier = self.checkpoint_steps[self.checkpoint_steps <= checkpoint_step]
        if not len(earlier):
            raise ValueError(f"no analysis checkpoint at or before step {checkpoint_step}")
        return int(earlier[-1])

    def batch(self, items: list, pad_id: int) -> dict:
        """Model inputs of some items, padded to their widest as the targets job padded each chunk of `chunk`
        items, with a 0/1 mask of the marker positions."""
        batch = pad_batch([p for p, _, _ in items], [c for _, c, _ in items], pad_id)
        mask = torch.zeros_like(batch["completion_ids"], dtype=torch.float32)
        for i, (_, _, positions) in enumerate(items):
            mask[i, positions] = 1.0
        batch["positions"] = mask
        return batch

    def values(self, model, batch: dict) -> torch.Tensor:
        """[items] each item's summed marker log-probs (f is their mean over all items)."""
        device = next(model.parameters()).device
        batch = {k: v.to(device) for k, v in batch.items()}
        logps = logprobs(model, batch, self.temperature, self.device)
        return (logps * batch["positions"]).sum(1)

    def value_sum(self, model, batch: dict) -> torch.Tensor:
        """Summed marker log-probs of a chunk (divide by the number of items for f)."""
        return self.values(model, batch).sum()
