"""A model's shapes without its weights: the transformers config a run's model section names, and the model it
describes built on the meta device. Validation and the cost plan count and name modules with it; nothing is
downloaded or allocated."""

from __future__ import annotations

from pathlib import Path


def transformers_config(model):
    """The transformers config of the model section `model`: the built-in tiny Qwen2's, else the local folder's or
    the local Hugging Face cache's (validation has already checked that one of them holds it)."""
    if model.is_tiny:
        from behaviortrace.model.tiny import qwen2_config

        return qwen2_config(model.tiny, vocab_size=64)  # the vocabulary's size changes no module's name
    from transformers import AutoConfig

    name = str(Path(model.name).expanduser()) if Path(model.name).expanduser().is_dir() else model.name
    return AutoConfig.from_pretrained(name, trust_remote_code=model.trust_remote_code)


def meta_model(config):
    """The model a transformers config describes, built on the meta device: shapes only, nothing allocated."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)
