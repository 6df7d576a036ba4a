"""Rule behavior: behavior rate on probe and plain prompts at every saved checkpoint of one seed."""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from behaviortrace.behavior.rates import behavior_rates
from behaviortrace.common import device as devices
from behaviortrace.common.io import atomic_write_parquet
from behaviortrace.config.sections import Config
from behaviortrace.model import models
from behaviortrace.train.checkpoints import read_manifest

log = logging.getLogger(__name__)


def behavior_job(
    cfg: Config, *, seed: int, checkpoints_path: Path, probes_path: Path, plain_path: Path, out: Path
) -> pl.DataFrame:
    device = devices.resolve(cfg.compute)
    prompt_sets = {"probes": pl.read_parquet(probes_path), "plain": pl.read_parquet(plain_path)}
    checkpoints, _ = read_manifest(checkpoints_path)
    rows = []
    for i, (step, path) in enumerate(checkpoints.items()):
        model, tokenizer = models.load(path, device)
        # The same sampling seed at every checkpoint, so rates differ by the weights, not by the draw; sampled in
        # training's precision (bf16 autocast for compute.dtype bfloat16).
        with devices.autocast(device):
            found = behavior_rates(
                model,
                tokenizer,
                prompt_sets,
                cfg.planting.marker,
                cfg.task.base_reward,
                cfg.probes.samples_per_prompt,
                cfg.grpo.sampling,
                cfg.probes.seed,
            )
        rows += [{"seed": seed, "step": step, "checkpoint": path.name, **row} for row in found]
        log.info(
            "checkpoint %d/%d (step %d): %s",
            i + 1,
            len(checkpoints),
            step,
            ", ".join(f"{r['prompt_set']} {r['behavior_rate']:.3f}" for r in rows[-2:]),
        )
    table = pl.DataFrame(rows)
    atomic_write_parquet(table, out)
    return table
