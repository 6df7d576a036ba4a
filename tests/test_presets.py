"""Every file in config/ as users pass it: real Snakemake in a copy of the workflow, which writes the run's record of
its whole config (rule run_config). A preset runs the defaults plus itself, whatever config/config.yaml holds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from behaviortrace.config.load import complete
from conftest import ROOT, fake_hub_cache, preset_hub_models

PRESETS = sorted(p.name for p in (ROOT / "config").glob("*.yaml"))


def workflow_copy(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "workflow", "config", "profiles", "envs"):
        source = ROOT / name
        shutil.copytree(source, dest / name) if source.is_dir() else shutil.copy(source, dest / name)
    return dest


def effective(workdir: Path, *args: str) -> tuple[dict, str]:
    """The record of the whole config a real Snakemake run of `args` writes (rule run_config alone), and its
    header."""
    cache = fake_hub_cache(workdir / ".hf_cache", *preset_hub_models())  # a preset's hub model, as if downloaded
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    preset = args[args.index("--configfile") + 1] if "--configfile" in args else "config/config.yaml"
    run = yaml.safe_load((workdir / preset).read_text()).get("run", "default")
    cmd = [sys.executable, "-m", "snakemake", "--cores", "1", *args, "--", f"results/{run}/config.yaml"]
    res = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    (record,) = (workdir / "results").glob("*/config.yaml")
    text = record.read_text()
    return yaml.safe_load(text), text


@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_runs_the_defaults_plus_itself(preset, tmp_path):
    workdir = workflow_copy(tmp_path)
    given = yaml.safe_load((workdir / "config" / preset).read_text())
    if preset != "config.yaml":  # whatever config/config.yaml holds does not reach another preset
        (workdir / "config" / "config.yaml").write_text("run: default\ngrpo:\n  steps: 70\n  lr: 0.5\n")
    args = [] if preset == "config.yaml" else ["--configfile", f"config/{preset}"]
    ran, text = effective(workdir, *args)
    assert ran == complete(given)
    assert "# behaviortrace: " in text and "# commit: " in text
    assert ran["grpo"]["lr"] != 0.5


def test_what_each_preset_names(tmp_path):
    """The settings each preset's comments and docs name, as Snakemake runs them."""
    ran = {}
    for preset in ("config.yaml", "paper.yaml", "paper_shape.yaml", "smooth.yaml", "peers.yaml"):
        args = [] if preset == "config.yaml" else ["--configfile", f"config/{preset}"]
        ran[preset] = effective(workflow_copy(tmp_path / preset.replace(".", "_")), *args)[0]
    default = ran["config.yaml"]
    smooth = {"adam_epsilon": 1e-3, "max_grad_norm": 1e9, "lr_scheduler": "constant_with_warmup", "warmup_steps": 10}
    assert default["grpo"] | smooth == default["grpo"] and default["grpo"]["steps"] == 60
    assert default["influence"]["measure_at"] == "window_start+10" and default["influence"]["lds_subsets"] == 30
    paper = {"adam_epsilon": 1e-8, "max_grad_norm": 1.0, "lr_scheduler": "constant", "warmup_steps": 0}
    for preset, steps in (("paper.yaml", 1000), ("paper_shape.yaml", 200)):
        assert ran[preset]["grpo"] | paper == ran[preset]["grpo"] and ran[preset]["grpo"]["steps"] == steps
        assert ran[preset]["influence"]["measure_at"] == "window_end"
    for preset in ("smooth.yaml", "peers.yaml"):  # the default regime
        assert {k: ran[preset]["grpo"][k] for k in smooth} == smooth
        assert ran[preset]["influence"]["measure_at"] == "window_start+10"
    assert ran["smooth.yaml"]["influence"]["lds_subsets"] == 100
    assert "dattri_trak" in ran["peers.yaml"]["estimators"]
    # The default run retrains its LDS subsets under its configured meaning of removal only; smooth.yaml under both.
    assert lds_meanings(default) == {default["influence"]["semantics"]}
    assert lds_meanings(ran["smooth.yaml"]) == {"advantages", "held"}


def lds_meanings(ran: dict) -> set[str]:
    """The meanings of removal the influence job retrains the LDS subsets under, with the config `ran`, on a rollout
    log of the config's shape before T."""
    import polars as pl

    from behaviortrace.configure import parse
    from behaviortrace.influence.sets import retrained_sets

    cfg = parse(ran)
    end, g, per_step = cfg.influence.end_step(cfg.planting, cfg.grpo.steps), cfg.grpo.num_generations, 2
    n = end * per_step * g
    rollouts = pl.DataFrame(
        {
            "rollout_id": range(n),
            "step": [i // (per_step * g) for i in range(n)],
            "group_id": [i // g for i in range(n)],
        }
    )
    return {z.semantics for z in retrained_sets(cfg, rollouts, end, "planted", 0, [], 0) if z.kind == "lds"}


def test_config_overrides_apply_over_a_preset(tmp_path):
    workdir = workflow_copy(tmp_path)
    ran = effective(workdir, "--configfile", "config/paper_shape.yaml", "--config", 'grpo={"steps": 120}')[0]
    assert ran["grpo"]["steps"] == 120 and ran["grpo"]["max_grad_norm"] == 1.0 and ran["run"] == "paper_shape"


@pytest.mark.parametrize(
    "override, expected",
    [
        ("grpo={'lr_scheduler': 'bogus'}", "config key grpo.lr_scheduler = 'bogus'"),
        ("grpo={'warmup_steps': 100000}", "config key grpo.warmup_steps = 100000: the warm-up would not end"),
        ("grpo={'lr_scheduler': 'constant'}", "config key grpo.warmup_steps = 10: grpo.lr_scheduler = 'constant'"),
        (
            "model={'lora': {'rank': 4, 'target_modules': ['nonexistent_proj']}}",
            "config key model.lora.target_modules = ['nonexistent_proj']: Qwen2ForCausalLM has no module named",
        ),
        (
            "model={'lora': {'rank': 4, 'target_modules': ['input_layernorm']}}",
            "config key model.lora.target_modules = ['input_layernorm']: peft refuses them",
        ),
        (
            "planting={'window': [10, 59]}|influence={'measure_at': 10}",
            "config key influence.measure_at = 10: T = 10 is at or before the first step of planting.window",
        ),
    ],
)
def test_settings_that_would_fail_or_mislead_later_are_refused_by_a_dry_run(override, expected, tmp_path):
    cmd = [sys.executable, "-m", "snakemake", "-n", "--config", *override.split("|")]
    res = subprocess.run(cmd, cwd=workflow_copy(tmp_path), capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and expected in res.stdout + res.stderr, (res.stdout + res.stderr)[-2000:]


def test_t_follows_a_moved_window(tmp_path):
    """The default T is ten steps after the window opens, wherever the window lies."""
    ran = effective(workflow_copy(tmp_path), "--config", "planting={'window': [10, 59]}")[0]
    from behaviortrace.configure import parse

    assert parse(ran).influence.end_step(parse(ran).planting, ran["grpo"]["steps"]) == 20


def test_every_allowed_scheduler_builds_from_steps_and_warm_up_alone():
    import torch
    from transformers import SchedulerType, get_scheduler

    from behaviortrace.config.sections import SCHEDULERS

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    for name in SCHEDULERS:
        assert name in {s.value for s in SchedulerType}
        get_scheduler(name, opt, num_warmup_steps=2, num_training_steps=10)
