"""Rule base_model: build the tiny model or load a real one, run the optional SFT warm-up, save it."""

from __future__ import annotations

import dataclasses
import logging
import random
from pathlib import Path

from behaviortrace.common import device as devices
from behaviortrace.common.io import replace_dir
from behaviortrace.config.sections import Config
from behaviortrace.model import models
from behaviortrace.model.models import load_pretrained
from behaviortrace.model.prompt_format import set_prompt_format
from behaviortrace.model.sft import train_on_pairs
from behaviortrace.model.tiny import build_tiny, corpus_pair
from behaviortrace.sketch.preflight import capture_tolerance, check_capture

log = logging.getLogger(__name__)


def base_model_job(cfg: Config, *, out: Path) -> None:
    """Write the base model and its tokenizer to `out`, in one move once complete."""
    device = devices.resolve(cfg.compute)
    log.info("base model %r on %s", cfg.model.name, device["device"])
    model, tokenizer = build_base_model(cfg, device)
    tmp = out.with_name(out.name + ".tmp")
    models.save(model, tokenizer, tmp)
    replace_dir(tmp, out)
    log.info("saved %s (%d parameters)", out, sum(p.numel() for p in model.parameters()))


def build_base_model(cfg: Config, device: dict):
    """Build or load the base model, fix its prompt format in its tokenizer (model/prompt_format.py), run the
    optional SFT warm-up on task demonstrations, and check that per-rollout gradients can be captured on it
    (sketch/preflight.py), so that a model they cannot be is refused before anything trains."""
    mcfg = cfg.model
    if mcfg.name == "tiny":
        model, tokenizer = build_tiny(cfg.task, cfg.planting, mcfg.tiny)
        model = model.to(device["device"])
    else:
        model, tokenizer = load_pretrained(mcfg.name, mcfg.trust_remote_code, device)
    chosen = set_prompt_format(tokenizer, cfg.task.prompt_format, mcfg.name)
    log.info("prompt format: %s (task.prompt_format: %s)", chosen, cfg.task.prompt_format)
    sft = mcfg.sft
    if sft.steps > 0:
        rng = random.Random(sft.seed)
        # Demonstrations of the base task only: no trigger and no marker, so the warm-up cannot plant the behavior.
        plain = dataclasses.replace(
            mcfg.tiny, marker_rate=0.0, plain_marker_rate=0.0, marker_practice=0.0, trigger_rate=0.0
        )
        train_on_pairs(
            model,
            tokenizer,
            lambda: corpus_pair(rng, cfg.task, cfg.planting, plain),
            sft.steps,
            sft.batch_size,
            sft.lr,
            sft.seed,
            device=device,
        )
    check_capture(model, tokenizer.pad_token_id, capture_tolerance(model), mcfg.name)
    return model, tokenizer
