"""Train-time capture (`sketch.mode: train`): every step's rollouts sketched inside training, at the exact
weights of the step that used them, before gradient clipping.

The trainer wraps TRL's loss forward in `recording`, calls `capture` once TRL's backward has computed the
step's gradient and before it clips it, and `commit` once it knows the step's learning rate and clip
coefficient. Each rollout's full gradient is read off TRL's own forward and backward pass
(sketch/loss_pass.py), so capture adds no second pass over the step; its behavior-token and null
shares take a pass of their own over the marked rollouts, in the same StepSketcher that sketches from
checkpoints. The summed sketches of a step are checked against the sketch of the gradient TRL itself
computed (its `.grad`), on every step. Stores keep
the layout of the sketch stage (sketch/store.py), one per shard of steps, written under the training
directory so that a killed training job resumes them; `publish` puts finished stores where the
workflow expects them.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import polars as pl

from behaviortrace.config.sections import Config
from behaviortrace.gradients.per_example import accumulated_grads
from behaviortrace.model import models
from behaviortrace.plant.markers import marker_token_ids
from behaviortrace.sketch.loss_pass import LossPassRecorder, RecordedStep
from behaviortrace.sketch.maps import SketchMap
from behaviortrace.sketch.sketcher import StepSketcher, check_step_sum
from behaviortrace.sketch.store import ShardWriter, open_store
from behaviortrace.sketch.tolerance import tolerance_for
from behaviortrace.train.checkpoints import checkpoint_for_step

log = logging.getLogger(__name__)


def shard_name(shard: int) -> str:
    return f"shard{shard:03d}.zarr"


class TrainCapture:
    """Sketches each training step's rollouts at the step's weights; one resumable store per shard."""

    def __init__(
        self,
        cfg: Config,
        model,
        tokenizer,
        ref_model,
        folder: Path,
        saved: list[int],
        fingerprint: str,
        device: dict,
    ):
        sketch, grpo = cfg.sketch, cfg.grpo
        self.cfg, self.folder, self.saved, self.fingerprint = cfg, Path(folder), saved, fingerprint
        self.smap = SketchMap.for_model(model, sketch.method, sketch.k, sketch.seed)
        self.smap.check_covers(model)
        marker = cfg.planting.marker
        self.sketcher = StepSketcher(
            self.smap,
            grpo,
            tokenizer,
            marker,
            marker_token_ids(tokenizer, marker),
            ref_model,
            sketch.chunk_rollouts,
            device,
        )
        self.attrs = {
            **self.smap.attrs(),
            "n_trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "model": cfg.model.name,
            "mode": "train",
        }
        self.recorder = LossPassRecorder(model, grpo.temperature)
        # Of the run's precision (compute.dtype), not of the weights: under bf16 autocast they stay float32.
        self.tolerance = tolerance_for(device["dtype"])
        self.recorded_step: int | None = None
        self.writers: dict[int, ShardWriter] = {}
        self.finished: set[int] = set()
        self.pending: tuple[int, dict, float] | None = None
        self.started, self.n_captured = time.time(), 0

    def _shard_of(self, step: int) -> int:
        return step // self.cfg.sketch.shard_steps

    def final_path(self, shard: int) -> Path:
        return self.folder / shard_name(shard)

    def _finished(self, shard: int) -> bool:
        if shard not in self.finished:
            path = self.final_path(shard)
            if path.exists() and open_store(path).attrs.get("fingerprint") == self.fingerprint:
                self.finished.add(shard)
        return shard in self.finished

    def _writer(self, shard: int, batch: int) -> ShardWriter:
        if shard not in self.writers:
            steps = list(self.cfg.sketch.shard_steps_of(shard, self.cfg.grpo.steps))
            step_col = np.repeat(steps, batch)
            rows = pl.DataFrame(
                {
                    "rollout_id": np.arange(steps[0] * batch, (steps[-1] + 1) * batch),
                    "step": step_col,
                    "checkpoint_step": [checkpoint_for_step(int(s), self.saved) for s in step_col],
                }
            )
            attrs = {**self.attrs, "shard": shard, "first_step": steps[0], "last_step": steps[-1]}
            self.writers[shard] = ShardWriter(
                self.final_path(shard),
                rows,
                pl.DataFrame({"step": steps}),
                self.smap.k,
                attrs,
                self.fingerprint,
                batch,
                deferred=True,
            )
        return self.writers[shard]

    def recording(self, step: int, inputs: dict):
        """Context around TRL's loss forward of `step`: records the per-rollout factors its backward yields."""
        self.recorded_step = None
        if self._finished(self._shard_of(step)):
            return nullcontext()  # a resumed run retrains steps of a shard that was already captured and finished
        self.recorded_step = step
        return self.recorder.recording(inputs)

    def capture(self, step: int, rows: pl.DataFrame, num_items: int, model) -> None:
        """Sketch the step's rollouts from TRL's loss pass (TRL's `.grad` holds the step's gradient and is left
        untouched: the behavior passes do not accumulate into it)."""
        self.pending = None
        if self._finished(self._shard_of(step)):
            return
        if self.recorded_step != step:
            raise RuntimeError(f"step {step}: TRL's loss pass was not recorded")
        recorded = self.recorder.finish(self.cfg.sketch.chunk_rollouts)
        rows = rows.sort("rollout_id")
        check_same_completions(recorded, rows["completion_ids"].to_list(), step)
        was_training = model.training
        norms_before = [float(g.norm()) for g in accumulated_grads(model).values()]
        arrays = self.sketcher.sketch_step(model, rows, num_items, recorded)
        model.train(was_training)
        trl_grads = accumulated_grads(model)
        if [float(g.norm()) for g in trl_grads.values()] != norms_before:
            raise RuntimeError("sketching changed the gradient TRL is about to apply")
        trl_sketch, _ = self.smap.sketch_dense(trl_grads)
        rel = check_step_sum(arrays["sketch"], trl_sketch, f"TRL's gradient of step {step}", self.tolerance)
        arrays.update(
            rollout_id=rows["rollout_id"].to_numpy(),
            step=np.full(rows.height, step),
            checkpoint_step=np.full(rows.height, checkpoint_for_step(step, self.saved)),
        )
        self.pending = (step, arrays, rel)

    def commit(self, step: int, lr: float, clip_coef: float, grad_norm: float) -> None:
        """Write the captured step with the facts known after clipping; finish its shard after its last step."""
        if self.pending is None:
            return
        captured, arrays, rel = self.pending
        if captured != step:
            raise RuntimeError(f"captured step {captured} but step {step} was committed")
        shard = self._shard_of(step)
        writer = self._writer(shard, len(arrays["norm"]))
        info = {"lr": lr, "clip_coef": clip_coef, "grad_norm": grad_norm, "self_check_error": rel}
        writer.write_step(step, arrays, info)
        self.pending, self.n_captured = None, self.n_captured + 1
        if not set(writer.steps) - writer.done_steps():
            worst = writer.finish()
            del self.writers[shard]
            self.finished.add(shard)
            log.info(
                "captured shard %d (steps %d..%d): largest self-check error %.2e; %.1f rollouts/s",
                shard,
                writer.steps[0],
                writer.steps[-1],
                worst,
                self.n_captured * len(arrays["norm"]) / (time.time() - self.started),
            )

    def flush(self) -> None:
        """Put every captured step on disk; the trainer calls this before each checkpoint it saves."""
        for writer in self.writers.values():
            writer.flush()


def check_same_completions(recorded: RecordedStep, completions: list[list[int]], step: int) -> None:
    """Each row TRL trained on is the logged rollout its place in generation order says; otherwise the
    recorded gradients would be stored under the wrong rollouts."""
    ids, mask = recorded.completion_ids.cpu(), recorded.completion_mask.cpu().bool()
    places = recorded.rows.cpu().tolist()
    if sorted(places) != list(range(len(completions))):
        raise RuntimeError(
            f"step {step}: TRL trained on {len(places)} rows, but {len(completions)} rollouts were logged"
        )
    for i, place in enumerate(places):
        if ids[i][mask[i]].tolist() != completions[place]:
            raise RuntimeError(f"step {step}: a completion TRL trained on differs from the logged rollout {place}")


def publish(folder: Path, shard: int, out: Path) -> None:
    """Put a finished captured store at the workflow's path: hard links (no copy) where the file system
    allows, a copy otherwise. The captured store stays, so a rerun can publish it again."""
    source = Path(folder) / shard_name(shard)
    open_store(source)  # finished, or an error that names it
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, tmp, copy_function=link)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)


def capture_factory(cfg: Config, model, tokenizer, base_model: Path, device: dict, folder: Path, fingerprint: str):
    """What `grpo.train` calls to make the train-time capture (sketch/capture.py) of this run."""
    from behaviortrace.sketch.capture import TrainCapture

    ref = models.load(base_model, device)[0].eval() if cfg.grpo.beta else None

    def make(saved: list[int]):
        return TrainCapture(cfg, model, tokenizer, ref, folder, saved, fingerprint, device)

    return make
