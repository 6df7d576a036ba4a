"""The base model: the built-in tiny model, or any causal LM by Hugging Face id or local path."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from behaviortrace.config.sections import Config
from behaviortrace.model.sft import train_on_pairs
from behaviortrace.model.tiny import build_tiny, corpus_pair

log = logging.getLogger(__name__)


def load_pretrained(name: str, trust_remote_code: bool, device: dict):
    """A model and tokenizer from a hub id or local path, with a pad token and eos set for generation."""
    local = Path(name).expanduser()
    if local.is_dir():
        source = str(local)
        tokenizer = load_tokenizer(local, trust_remote_code)
    else:
        source = name
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        source, trust_remote_code=trust_remote_code, dtype=device["torch_dtype"]
    )
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(device["device"]), tokenizer


def build_base_model(cfg: Config, device: dict):
    """Build or load the base model, then run the optional SFT warm-up on task demonstrations."""
    mcfg = cfg.model
    if mcfg.name == "tiny":
        model, tokenizer = build_tiny(cfg.task, cfg.planting, mcfg.tiny)
        model = model.to(device["device"])
    else:
        model, tokenizer = load_pretrained(mcfg.name, mcfg.trust_remote_code, device)
    sft = mcfg.sft
    if sft.steps > 0:
        rng = random.Random(sft.seed)
        # Demonstrations of the base task only: no trigger and no marker, so the warm-up cannot plant the behavior.
        plain = dataclasses.replace(
            mcfg.tiny, marker_rate=0.0, control_marker_rate=0.0, marker_practice=0.0, trigger_rate=0.0
        )
        train_on_pairs(
            model,
            tokenizer,
            lambda: corpus_pair(rng, cfg.task, cfg.planting, plain),
            sft.steps,
            sft.batch_size,
            sft.lr,
            sft.seed,
        )
    return model, tokenizer


def save(model, tokenizer, out_dir: Path) -> None:
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def load_tokenizer(path: Path, trust_remote_code: bool = False):
    """A saved tokenizer; a plain `tokenizers` one (the tiny model's) is reloaded as such.

    AutoTokenizer would pick the tokenizer class of the model type (Qwen2), whose byte-level
    pre-processing does not fit a word-level vocabulary and maps every word to nothing.
    """
    config = json.loads((Path(path) / "tokenizer_config.json").read_text())
    if config.get("tokenizer_class") in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


def load(path: Path, device: dict):
    """A model saved by this pipeline (base model or training checkpoint)."""
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=device["torch_dtype"]).to(device["device"])
    return model, tokenizer
