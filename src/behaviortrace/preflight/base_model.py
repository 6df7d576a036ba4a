"""The base model of a run (rule base_model): the built-in tiny model or a real one, its prompt format, the optional
SFT warm-up, and a check that per-rollout gradients can be captured on it."""

from __future__ import annotations

import dataclasses
import logging
import random

from behaviortrace.config.sections import Config
from behaviortrace.model.models import load_pretrained
from behaviortrace.model.prompt_format import set_prompt_format
from behaviortrace.model.sft import train_on_pairs
from behaviortrace.model.tiny import build_tiny, corpus_pair
from behaviortrace.sketch.preflight import capture_tolerance, check_capture

log = logging.getLogger(__name__)


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
