"""Rules preflight and base_model: try every job that needs the model on it before anything trains; build the
tiny model or load a real one, run the optional SFT warm-up, save it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from behaviortrace.common import device as devices
from behaviortrace.common.io import atomic_write_text, replace_dir, scratch_dir
from behaviortrace.config.sections import Config
from behaviortrace.model import models
from behaviortrace.preflight.base_model import build_base_model
from behaviortrace.preflight.checks import check_jobs, preflight_model

log = logging.getLogger(__name__)


def preflight_job(cfg: Config, *, out: Path) -> None:
    """Try every job that needs the model on it, before the base model is built (so before the SFT warm-up), and
    write how long each took to `out`; refuse the model (RefusedModel) if any cannot run."""
    device = devices.resolve(cfg.compute)
    model, tokenizer = preflight_model(cfg, device)
    with scratch_dir(out.parent / ".preflight") as scratch:
        seconds = check_jobs(model, tokenizer, cfg, device, scratch)
    atomic_write_text(json.dumps({"model": cfg.model.name, "seconds": seconds}, indent=1) + "\n", out)


def base_model_job(cfg: Config, *, out: Path) -> None:
    """Write the base model and its tokenizer to `out`, in one move once complete."""
    device = devices.resolve(cfg.compute)
    log.info("base model %r on %s", cfg.model.name, device["device"])
    model, tokenizer = build_base_model(cfg, device)
    tmp = out.with_name(out.name + ".tmp")
    models.save(model, tokenizer, tmp)
    replace_dir(tmp, out)
    log.info("saved %s (%d parameters)", out, sum(p.numel() for p in model.parameters()))
