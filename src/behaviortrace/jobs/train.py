"""Rule train_grpo: GRPO for one seed, logging every rollout (and, with `sketch.mode: train`, sketching
them as they are trained on); resumes from its last checkpoint."""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from behaviortrace.common import device as devices
from behaviortrace.config.sections import Config
from behaviortrace.sketch.capture import capture_factory
from behaviortrace.sketch.preflight import training_model
from behaviortrace.train import grpo
from behaviortrace.train.checkpoints import check_disk
from behaviortrace.train.outputs import PEAK_GPU_MEMORY, finalize

log = logging.getLogger(__name__)


def train_job(
    cfg: Config,
    *,
    seed: int,
    base_model: Path,
    prompts: Path,
    probes: Path,
    train_dir: Path,
    rollouts_path: Path,
    steps_path: Path,
    manifest_path: Path,
    shards: list[Path] = (),
) -> pl.DataFrame:
    """Train one seed (resuming where a killed job stopped) and write its rollout log, step log and manifest;
    with `sketch.mode: train`, also its sketch stores (`shards`, one per shard of steps, in order)."""
    device = devices.resolve(cfg.compute)
    model, tokenizer = training_model(cfg, base_model, device, seed)
    check_disk(cfg, model, Path(train_dir))
    fingerprint = grpo.run_fingerprint(cfg.to_dict(), seed, [base_model, prompts])
    capture_dir = Path(train_dir) / "capture"
    captures = cfg.has("sketch") and cfg.sketch.mode == "train"
    factory = capture_factory(cfg, model, tokenizer, base_model, device, capture_dir, fingerprint) if captures else None
    info = grpo.train(
        model,
        tokenizer,
        pl.read_parquet(prompts),
        cfg,
        seed,
        train_dir,
        device,
        fingerprint,
        capture_factory=factory,
        probes=pl.read_parquet(probes),
    )
    rollouts = finalize(
        train_dir,
        cfg.grpo.steps,
        info["batch_size"],
        rollouts_path,
        steps_path,
        manifest_path,
        info["saved_steps"],
        info["final_target_logprob"],
    )
    if factory is not None:
        from behaviortrace.sketch.capture import publish

        for shard, out in enumerate(shards):
            publish(capture_dir, shard, out)
    log.info("seed %d: %d rollouts logged, %d paid", seed, rollouts.height, int(rollouts["paid"].sum()))
    if device["use_cuda"]:
        import torch

        log.info("%s %.0f MiB", PEAK_GPU_MEMORY, torch.cuda.max_memory_allocated() / 2**20)
    return rollouts
