"""Rule plant_data: training prompts in training order; held-out probe and plain prompts."""

from __future__ import annotations

import logging
from pathlib import Path

from behaviortrace.common.io import atomic_write_parquet
from behaviortrace.config.sections import Config
from behaviortrace.plant.prompts import plant_prompts

log = logging.getLogger(__name__)


def plant_data_job(cfg: Config, *, train: Path, probes: Path, plain: Path) -> None:
    tables = plant_prompts(cfg.task, cfg.planting, cfg.grpo, cfg.probes, cfg.probes.seed)
    for name, path in (("train", train), ("probes", probes), ("plain", plain)):
        atomic_write_parquet(tables[name], path)
        log.info("%s: %d prompts (%d with trigger)", name, tables[name].height, int(tables[name]["trigger"].sum()))
