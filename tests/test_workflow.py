"""Real Snakemake runs of the workflow on a shrunken default config."""

import json
import subprocess
import sys

import numpy as np
import polars as pl
import pytest
import yaml

from behaviortrace.sketchstore import open_store, read_rows

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
        shards = [read_rows([out / f"seed{seed}" / "sketch" / f"shard{i:03d}.zarr"], with_sketches=False)[0]
                  for i in range(2)]
        assert np.concatenate([r["rollout_id"] for r in shards]).tolist() == rollouts["rollout_id"].sort().to_list()
        for draw in range(cfg["targets"]["draws"]):
            assert open_store(out / f"seed{seed}" / "targets" / f"draw{draw}.zarr")["forced"].shape[0] == len(
                manifest["checkpoints"])
    headroom = pl.read_parquet(out / "tables" / "headroom.parquet")
    assert headroom.height == len(cfg["seeds"]) * cfg["targets"]["draws"] * len(manifest["checkpoints"])
    assert "| seed | draw | step |" in (out / "tables" / "headroom.md").read_text()
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
    sketch_log = (logs / "sketch" / "seed1_shard001.log").read_text()
    assert "self-check" in sketch_log and "step 5 (checkpoint 4)" in sketch_log and "rollouts/s" in sketch_log
    assert "checkpoint 5/5 (step 6)" in (logs / "targets" / "seed0_draw1.log").read_text()


def test_second_run_has_nothing_to_do(finished_run):
    workdir, _ = finished_run
    res = snakemake(workdir, "-n")
    assert res.returncode == 0
    assert "Nothing to be done" in res.stdout + res.stderr
