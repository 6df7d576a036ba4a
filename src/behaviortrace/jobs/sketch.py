"""Rules sketch, sketch_matrix and sketch_gram: every logged rollout of one (seed, shard of steps) into one
store; a seed's shards stacked into one matrix; that matrix's Gram matrix.

torch, transformers and the sketcher are imported inside `sketch_job` only: the other two jobs are
numpy work that would otherwise spend seconds importing them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import polars as pl

from behaviortrace.config.sections import Config
from behaviortrace.sketch import moments
from behaviortrace.sketch.store import ShardWriter, fingerprint, write_matrix
from behaviortrace.train.checkpoints import read_manifest

log = logging.getLogger(__name__)


def sketch_job(
    cfg: Config,
    *,
    shard: int,
    rollouts_path: Path,
    steps_path: Path,
    checkpoints_path: Path,
    base_model: Path,
    out: Path,
) -> None:
    """Sketch every rollout of one shard of steps at its generating checkpoint; resumable by step."""
    from behaviortrace.common import device as devices
    from behaviortrace.model import models
    from behaviortrace.plant.markers import marker_token_ids
    from behaviortrace.sketch.maps import SketchMap
    from behaviortrace.sketch.sketcher import StepSketcher, check_step_sum
    from behaviortrace.sketch.tolerance import tolerance_for

    sketch, grpo, marker = cfg.sketch, cfg.grpo, cfg.planting.marker
    device = devices.resolve(cfg.compute)
    steps = list(sketch.shard_steps_of(shard, grpo.steps))
    # Only this shard's rows are read, so memory does not grow with the length of training.
    rollouts = pl.scan_parquet(rollouts_path).filter(pl.col("step").is_in(steps)).collect().sort("rollout_id")
    step_info = pl.read_parquet(steps_path).filter(pl.col("step").is_in(steps)).sort("step")
    if step_info["step"].to_list() != steps or rollouts["step"].unique().sort().to_list() != steps:
        raise ValueError(f"{rollouts_path} / {steps_path}: steps {steps[0]}..{steps[-1]} are not all logged")
    ckpt_paths, _ = read_manifest(checkpoints_path)
    needed = sorted(set(rollouts["checkpoint_step"].to_list()))
    missing = [s for s in needed if s not in ckpt_paths]
    if missing:
        raise FileNotFoundError(f"{checkpoints_path}: no checkpoint for steps {missing}")

    model, tokenizer = models.load(ckpt_paths[needed[0]], device)
    smap = SketchMap.for_model(model, sketch.method, sketch.k, sketch.seed)
    smap.check_covers(model)
    ref = models.load(base_model, device)[0].eval() if grpo.beta else None
    # The model's passes run in the run's precision (bf16 autocast for compute.dtype bfloat16), as training's did.
    sketcher = StepSketcher(
        smap, grpo, tokenizer, marker, marker_token_ids(tokenizer, marker), ref, sketch.chunk_rollouts, device
    )
    # Counted from the model itself, so the checklist can compare it with what the sketch map covers.
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    attrs = {
        **smap.attrs(),
        "n_trainable": n_trainable,
        "model": cfg.model.name,
        "shard": shard,
        "first_step": steps[0],
        "last_step": steps[-1],
        "checkpoints": {str(s): ckpt_paths[s].name for s in needed},
    }
    params = {
        "sketch": asdict(sketch),
        "grpo": asdict(grpo),
        "marker": marker,
        "shard": shard,
        # bfloat16 now means float32 weights under bf16 autocast: stores written with bf16 weights do not match.
        "dtype": "bfloat16-mixed" if device["dtype"] == "bfloat16" else device["dtype"],
    }
    writer = ShardWriter(
        out,
        rollouts.select("rollout_id", "step", "checkpoint_step"),
        step_info,
        smap.k,
        attrs,
        fingerprint(rollouts_path, params),
        int(rollouts.filter(pl.col("step") == steps[0]).height),
    )
    done = writer.done_steps()
    log.info(
        "shard %d: steps %d..%d, %d rollouts, %s k=%d over %d parameters; %d steps already done",
        shard,
        steps[0],
        steps[-1],
        rollouts.height,
        smap.method,
        smap.k,
        smap.n_params,
        len(done),
    )
    loaded, checked, started, n_done = needed[0], False, time.time(), 0
    for step in steps:
        if step in done:
            continue
        rows = rollouts.filter(pl.col("step") == step)
        ckpt = int(rows["checkpoint_step"][0])
        if ckpt != loaded:
            model, _ = models.load(ckpt_paths[ckpt], device)
            loaded = ckpt
        num_items = int(step_info.filter(pl.col("step") == step)["num_items_in_batch"][0])
        arrays = sketcher.sketch_step(model, rows, num_items)
        info = {}
        if not checked:  # the sum of the rollouts' sketches against an ordinary backward pass, once per job
            step_sketch, _ = sketcher.step_gradient_sketch(model, rows, num_items)
            tolerance = tolerance_for(device["dtype"])
            info["self_check_error"] = check_step_sum(arrays["sketch"], step_sketch, "the step gradient", tolerance)
            log.info(
                "self-check: per-rollout sketches sum to the step gradient's sketch within %.2e",
                info["self_check_error"],
            )
            checked = True
        arrays.update({n: rows[n].to_numpy() for n in ("rollout_id", "step", "checkpoint_step")})
        writer.write_step(step, arrays, info)
        n_done += 1
        rate = n_done * rows.height / (time.time() - started)
        log.info(
            "step %d (checkpoint %d): %d rollouts, %d with marker; %.1f rollouts/s",
            step,
            ckpt,
            rows.height,
            int(arrays["has_marker"].sum()),
            rate,
        )
    writer.finish()
    log.info("shard %d complete: %s", shard, out)


def matrix_job(*, shards: list[Path], out: Path) -> None:
    """Stack one seed's shard sketches into the memory-mappable matrix every score job reads."""
    started = time.time()
    n, k = write_matrix(shards, out)
    log.info("%d sketches of width %d stacked into %s in %.1f s", n, k, out, time.time() - started)


def gram_job(*, matrix: Path, out: Path) -> None:
    """The Gram matrix of one seed's stacked sketches on the smaller side, and their column sums of
    squares (sketch/moments.py)."""
    started = time.time()
    phi = np.load(matrix, mmap_mode="r")
    side = moments.smaller_side(*phi.shape)
    moments.write_gram(moments.gram(phi, side), side, moments.squares(phi), out)
    log.info(
        "Gram matrix (%s side) of %d sketches of width %d in %.1f s: %s", side, *phi.shape, time.time() - started, out
    )
