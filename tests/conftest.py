"""Shared fixtures: a small but real config, tiny base model and planted data, built once per session."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from behaviortrace.tools.small_runs import default_config, small_config, workflow_config  # noqa: F401 (fixtures' configs)
from tolerance import install_audit

pytest_plugins = ["cpu_time"]  # --cpu-durations N (tests/cpu_time.py)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
install_audit()  # BT_TOLERANCE_SCALE: a no-op unless set (tests/tolerance.py)


# Modules whose tests compare the floating-point results of two computations (training and its replay, capture
# and autograd, float32 and float64, a trained model's rates and a threshold). `make test` runs them a second
# time under a lower CPU capability (ATEN_CPU_CAPABILITY), so that a tolerance only one processor meets fails
# where it is written (docs/reruns.md). Tests on a whole workflow run are left out: their numbers come from the
# code these tests cover, and the run alone takes longer than all of them.
NUMERIC_MODULES = {
    "test_capture",
    "test_estimators",
    "test_float64",
    "test_grpo",
    "test_influence",
    "test_lora",
    "test_mixed_precision",
    "test_model_families",
    "test_optimizer_effect",
    "test_replay",
    "test_rollout_loss",
    "test_sketch_stage",
    "test_sketchmap",
    "test_tiny_model",
}


def pytest_collection_modifyitems(items):
    for item in items:
        if item.module.__name__ in NUMERIC_MODULES and "finished_run" not in item.fixturenames:
            item.add_marker(pytest.mark.numerics)


def fake_hub_cache(root: Path, *repo_ids: str) -> Path:
    """A Hugging Face cache at `root` holding each of `repo_ids` as huggingface_hub lays it out (refs/main naming
    a snapshot that has a config.json): a hit for the hub's cache lookup, which validation asks for a hub id
    (config/rules.py), with nothing downloaded."""
    revision = "0" * 40
    for repo_id in repo_ids:
        repo = root / f"models--{repo_id.replace('/', '--')}"
        (repo / "snapshots" / revision).mkdir(parents=True, exist_ok=True)
        (repo / "snapshots" / revision / "config.json").write_text("{}")
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return root


def preset_hub_models() -> list[str]:
    """The hub ids that the presets under config/ name as model.name."""
    names = [
        (yaml.safe_load(p.read_text()) or {}).get("model", {}).get("name") for p in (ROOT / "config").glob("*.yaml")
    ]
    return sorted({name for name in names if name and name != "tiny"})


def typed(raw: dict):
    """The typed config the library takes, from a (possibly edited) config dict."""
    from behaviortrace.config.sections import Config

    return Config.from_dict(raw)


@pytest.fixture(scope="session")
def cfg() -> dict:
    return small_config()


@pytest.fixture(scope="session")
def cpu() -> dict:
    from behaviortrace.common.device import resolve
    from behaviortrace.config.sections import Compute

    return resolve(Compute(device="cpu", dtype="float32"))


@pytest.fixture(scope="session")
def base_model_dir(tmp_path_factory, cfg, cpu) -> Path:
    from behaviortrace.model import models
    from behaviortrace.preflight.base_model import build_base_model

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("base") / "base_model"
    model, tokenizer = build_base_model(typed(cfg), cpu)
    models.save(model, tokenizer, out)
    return out


@pytest.fixture(scope="session")
def prompts(cfg):
    from behaviortrace.plant.prompts import plant_prompts

    c = typed(cfg)
    return plant_prompts(c.task, c.planting, c.grpo, c.probes, c.probes.seed)


@pytest.fixture(scope="session")
def small_run(tmp_path_factory, cfg, base_model_dir, prompts, cpu) -> dict:
    """One real GRPO run of the small config, with its rollout log, step log and checkpoints on disk."""
    from behaviortrace.tools.grpo_checks import run_training

    out = tmp_path_factory.mktemp("small_run")
    prompts_path = out / "train_prompts.parquet"
    prompts["train"].write_parquet(prompts_path)
    for name in ("probes", "plain"):
        prompts[name].write_parquet(out / f"{name}.parquet")
    rollouts, _ = run_training(cfg, base_model_dir, prompts["train"], 0, out, cpu, probes=prompts["probes"])
    return {"dir": out, "rollouts": rollouts, "cfg": cfg, "base_model": base_model_dir}


def per_row_gradients(model, batch: dict, loss_args: dict) -> dict:
    """Each rollout's gradient by its own backward pass (the independent reference)."""
    from behaviortrace.gradients.batch import completion_logps, rows_of
    from behaviortrace.train.trl_surface import rollout_losses

    n = batch["advantages"].shape[0]
    grads = {name: [] for name, p in model.named_parameters() if p.requires_grad}
    for i in range(n):
        model.zero_grad(set_to_none=True)
        row = rows_of(batch, i, i + 1)
        rollout_losses(
            completion_logps(model, row, loss_args["temperature"]), row, **loss_args["loss"]
        ).sum().backward()
        for name, p in model.named_parameters():
            if p.requires_grad:
                grads[name].append(p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
    model.zero_grad(set_to_none=True)
    return {name: torch.stack(g) for name, g in grads.items()}


@pytest.fixture(scope="session")
def rollout_gradients(small_run, cpu):
    """Real per-rollout gradients of step 1 at checkpoint 0, by autograd one rollout at a time (no KL)."""
    import polars as pl

    from behaviortrace.gradients.batch import step_batch
    from behaviortrace.gradients.per_example import param_layout
    from behaviortrace.model import models

    model, tokenizer = models.load(small_run["dir"] / "train" / "checkpoint-0", cpu)
    batch = step_batch(small_run["rollouts"].filter(pl.col("step") == 1), tokenizer.pad_token_id)
    args = {
        "temperature": 1.0,
        "loss": {
            "loss_type": "dapo",
            "beta": 0.0,
            "max_completion_length": 10,
            "num_items": int(batch["completion_mask"].sum()),
            "n_rows": 12,
        },
    }
    return param_layout(model), per_row_gradients(model, batch, args)


def snakemake(workdir, *args):
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(ROOT / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        "--cores",
        "2",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """A real Snakemake run of the whole workflow (two seeds and a placebo seed) on the small config."""
    workdir = tmp_path_factory.mktemp("workflow")
    cfg = workflow_config()
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    res = snakemake(workdir)
    assert res.returncode == 0, res.stderr[-4000:]
    return workdir, cfg


@pytest.fixture(scope="session")
def trained_seed(request, tmp_path_factory):
    """The same workflow run only as far as an estimator that needs the model reads (the first planted seed's
    training and its draw-0 targets): its numerical checks need no more, and rerun alone under a second CPU. A
    session that runs the whole workflow anyway (finished_run: the same config, so the same files) reads that."""
    if any("finished_run" in item.fixturenames for item in request.session.items):
        return request.getfixturevalue("finished_run")
    workdir = tmp_path_factory.mktemp("trained_seed")
    cfg = workflow_config()
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    res = snakemake(workdir, f"results/{cfg['run']}/planted0/targets/draw0.zarr")
    assert res.returncode == 0, res.stderr[-4000:]
    return workdir, cfg


@pytest.fixture(scope="session")
def second_study(finished_run, tmp_path_factory):
    """The same small study with other training seeds (their own sampling of every rollout): a rerun that
    three-valued verdicts must not contradict. Run as far as its checklist, and without the LDS retrained under the
    other meaning of removal, which the checklist does not read (it reads `influence.semantics` only)."""
    workdir = tmp_path_factory.mktemp("second_study")
    cfg = copy.deepcopy(finished_run[1])
    cfg.update(seeds=[2, 3])
    cfg["placebo"]["seeds"] = [2]
    cfg["influence"]["lds_both_semantics"] = False
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    res = snakemake(workdir, f"results/{cfg['run']}/checklist.json")
    assert res.returncode == 0, res.stderr[-4000:]
    return workdir, cfg


def model_scores(module: str, run, target, **settings) -> np.ndarray:
    """An estimator that needs the model, run as the workflow runs it (score/contract.py): its per-seed preparation,
    then its score of each rollout, in the run's rollout order."""
    from behaviortrace.score import contract

    rollouts, _ = contract.run(module, settings, run, target)
    return rollouts["score"].to_numpy()
