"""Rule base_model: build the tiny model or load a real one, run the optional SFT warm-up, save it."""

from __future__ import annotations

import logging
from pathlib import Path

from behaviortrace.common import device as devices
from behaviortrace.common.io import replace_dir
from behaviortrace.config.sections import Config
from behaviortrace.model import models

log = logging.getLogger(__name__)


def base_model_job(cfg: Config, *, out: Path) -> None:
    """Write the base model and its tokenizer to `out`, in one move once complete."""
    device = devices.resolve(cfg.compute)
    log.info("base model %r on %s", cfg.model.name, device["device"])
    model, tokenizer = models.build_base_model(cfg, device)
    tmp = out.with_name(out.name + ".tmp")
    models.save(model, tokenizer, tmp)
    replace_dir(tmp, out)
    log.info("saved %s (%d parameters)", out, sum(p.numel() for p in model.parameters()))
