"""The base model: the built-in tiny model, or any causal LM by Hugging Face id or local path.

Every model is loaded without dropout: the per-rollout gradients captured during training are recomputed from
checkpoints (sketch.mode: checkpoint), for targets and in replays, and each of those passes must see the function
TRL differentiated. Dropout rates are zeroed in the model config (transformers reads them there, some as plain
floats rather than Dropout modules) and in any Dropout module left. A model loaded in float64 (the exact
influence's checks) computes in float64 throughout (precision.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from behaviortrace.model.precision import keep_float64


def _is_dropout_rate(key: str, value) -> bool:
    rate = isinstance(value, (int, float)) and not isinstance(value, bool)
    return rate and bool(value) and ("dropout" in key or key.endswith("pdrop") or key == "layerdrop")


def without_dropout(config):
    """The config with every dropout rate (dropout, attention_dropout, resid_pdrop, layerdrop, ...) set to 0."""
    for part in {id(config): config, id(config.get_text_config()): config.get_text_config()}.values():
        for key, value in list(vars(part).items()):
            if _is_dropout_rate(key, value):
                setattr(part, key, 0.0)
    return config


def _from_pretrained(source: str, trust_remote_code: bool, device: dict):
    config = without_dropout(AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code))
    model = AutoModelForCausalLM.from_pretrained(
        source, config=config, trust_remote_code=trust_remote_code, dtype=device["torch_dtype"]
    )
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    if device["torch_dtype"] == torch.float64:  # the influence's checks: float64 throughout (precision.py)
        keep_float64(model)
    return model.to(device["device"])


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
    model = _from_pretrained(source, trust_remote_code, device)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
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
    """A model saved by this pipeline (base model or training checkpoint; a LoRA checkpoint comes back as its base
    model with the adapter attached, model/lora.py)."""
    from behaviortrace.model import lora

    tokenizer = load_tokenizer(path)
    if lora.is_adapter(path):
        return lora.attach(_from_pretrained(str(lora.base_of(path)), False, device), path), tokenizer
    return _from_pretrained(str(path), False, device), tokenizer
