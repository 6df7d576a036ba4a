"""LoRA (`model.lora`): peft adapters on a frozen base model, trained by TRL in place of every weight.

Only the adapter's parameters require gradients, so everything that follows the trainable parameters (TRL's
optimizer, train-time capture and its self-check, the AdamW second moments, targets, replay and influence)
covers exactly them. A checkpoint holds the adapter and names the base model it sits on by absolute path
(`adapter_config.json`); `models.load` rebuilds base + adapter from it, the same function with the same
trainable parameters under the same names. Dropout stays 0 (see models.py).
"""

from __future__ import annotations

import json
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"


def wrap(model, lora, base_model: Path, seed: int):
    """`model` (the base model, loaded from `base_model`) with fresh LoRA adapters (B = 0: the same function). A is
    drawn from torch's global generator, seeded here with the training seed (and restored after), so a run and its
    resumption start from the same adapter."""
    import torch
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=list(lora.target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=str(Path(base_model).resolve()),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def adapter_parameters(model, rank: int, target_modules) -> int:
    """The parameters LoRA would train on `model`: rank x (inputs + outputs) per targeted linear layer, counted
    without building the adapters (the cost plan's 7B model lives on the meta device)."""
    import torch

    targets = set(target_modules)
    return sum(
        rank * (m.in_features + m.out_features)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets
    )


def config_problems(cfg) -> list[str]:
    """`model.lora.target_modules` checked against the model's own modules, on the meta device, by peft's own
    matching: a name the model lacks would otherwise fail only when training builds the adapter."""
    lora = cfg.model.lora
    if not lora.enabled:
        return []
    from peft import LoraConfig, inject_adapter_in_model

    from behaviortrace.model import meta

    try:
        model = meta.meta_model(meta.transformers_config(cfg.model))
    except (OSError, ValueError):
        return []  # a model validation cannot read: the model.name rule says why
    modules = [name for name, _ in model.named_modules()]
    leaves = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if not list(m.children())})
    # peft's rule for a list of names: a module matches a name it equals or ends with after a dot.
    missing = [t for t in lora.target_modules if not any(m == t or m.endswith("." + t) for m in modules)]
    if missing:
        return [
            f"config key model.lora.target_modules = {list(lora.target_modules)}: {type(model).__name__} has no "
            f"module named {missing}; its leaf modules are {leaves}"
        ]
    try:
        inject_adapter_in_model(LoraConfig(r=lora.rank, target_modules=list(lora.target_modules)), model)
    except ValueError as err:  # a module peft cannot put an adapter on (a norm, a rotary embedding)
        return [f"config key model.lora.target_modules = {list(lora.target_modules)}: peft refuses them ({err})"]
    return []


def is_adapter(path: Path) -> bool:
    """Whether a saved model folder holds an adapter (on a base model it names) rather than whole weights."""
    return (Path(path) / ADAPTER_CONFIG).exists()


def base_of(path: Path) -> Path:
    """The base model folder an adapter checkpoint was trained on."""
    return Path(json.loads((Path(path) / ADAPTER_CONFIG).read_text())["base_model_name_or_path"])


def attach(base, path: Path):
    """The base model with the adapter saved at `path`, trainable (as it was in training)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base, str(path), is_trainable=True)


def unwrap(model):
    """The transformers model under an adapter (the model itself when it has none)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) and hasattr(model, "peft_config") else model


def drop_reference_adapter(model) -> None:
    """TRL copies a PeftModel's adapter to a frozen 'ref' adapter for the KL term (beta > 0). Training here always
    starts from a fresh adapter (B = 0), whose function is the base model's, and TRL uses the base model (adapters
    disabled) when there is no 'ref'; the base model is also the reference every later stage loads. Removing the
    copy keeps checkpoints to the one trained adapter."""
    if "ref" in getattr(model, "peft_config", {}):
        model.delete_adapter("ref")
