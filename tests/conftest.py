"""Shared fixtures: a small but real config, tiny base model and planted data, built once per session."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]


def default_config() -> dict:
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def small_config() -> dict:
    """The default config, shrunk so that a real GRPO run takes seconds."""
    cfg = copy.deepcopy(default_config())
    cfg["seeds"] = [0]
    cfg["model"]["tiny"]["pretrain_steps"] = 40
    cfg["probes"].update(n_probes=8, n_controls=8, samples_per_prompt=2)
    cfg["grpo"].update(steps=6, prompts_per_step=3, num_generations=4, save_every=2, warmup_steps=0)
    cfg["planting"]["window"] = [0, 2]
    return cfg


@pytest.fixture(scope="session")
def cfg() -> dict:
    return small_config()


@pytest.fixture(scope="session")
def cpu() -> dict:
    from behaviortrace.device import resolve
    return resolve({"device": "cpu", "dtype": "float32"})


@pytest.fixture(scope="session")
def base_model_dir(tmp_path_factory, cfg, cpu) -> Path:
    from behaviortrace import models
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("base") / "base_model"
    model, tokenizer = models.build_base_model(cfg, cpu)
    models.save(model, tokenizer, out)
    return out


@pytest.fixture(scope="session")
def prompts(cfg):
    from behaviortrace.data import plant_prompts
    return plant_prompts(cfg["task"], cfg["planting"], cfg["grpo"], cfg["probes"], cfg["probes"]["seed"])
