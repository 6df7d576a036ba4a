"""Real Snakemake runs of the workflow on a shrunken default config."""

import json
import subprocess
import sys

import polars as pl
import pytest
import yaml

from conftest import ROOT, small_config


def snakemake(workdir, *args):
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(workdir / "config.yaml"), "--cores", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("workflow")
    cfg = small_config()
    cfg.update(run="wf", seeds=[0, 1])
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    res = snakemake(workdir)
    assert res.returncode == 0, res.stderr[-4000:]
    return workdir, cfg


def test_every_output_exists_and_is_consistent(finished_run):
    workdir, cfg = finished_run
    out = workdir / "results" / "wf"
    g = cfg["grpo"]
    for seed in cfg["seeds"]:
        rollouts = pl.read_parquet(out / f"seed{seed}" / "rollouts.parquet")
        assert rollouts.height == g["steps"] * g["prompts_per_step"] * g["num_generations"]
        assert rollouts["seed"].unique().to_list() == [seed]
        steps = pl.read_parquet(out / f"seed{seed}" / "steps.parquet")
        assert steps["step"].to_list() == list(range(g["steps"]))
        assert ((steps["clip_coef"] > 0) & (steps["clip_coef"] <= 1)).all()
        manifest = json.loads((out / f"seed{seed}" / "checkpoints.json").read_text())
        behavior = pl.read_parquet(out / f"seed{seed}" / "behavior.parquet")
        assert sorted(behavior["step"].unique().to_list()) == [c["step"] for c in manifest["checkpoints"]]
        assert set(behavior["prompt_set"]) == {"probes", "controls"}
    summary = pl.read_parquet(out / "tables" / "training.parquet")
    assert summary["seed"].to_list() == cfg["seeds"]
    assert "n_boosted_zero_advantage" in summary.columns
    assert "| seed |" in (out / "tables" / "training.md").read_text()


def test_each_rule_logs_its_progress(finished_run):
    workdir, _ = finished_run
    logs = workdir / "results" / "wf" / "logs"
    assert "supervised step" in (logs / "base_model.log").read_text()
    train_log = (logs / "train_grpo" / "seed0.log").read_text()
    assert "step 6/6" in train_log and "saved checkpoint checkpoint-6" in train_log
    assert "checkpoint 5/5" in (logs / "behavior" / "seed1.log").read_text()


def test_second_run_has_nothing_to_do(finished_run):
    workdir, _ = finished_run
    res = snakemake(workdir, "-n")
    assert res.returncode == 0
    assert "Nothing to be done" in res.stdout + res.stderr
