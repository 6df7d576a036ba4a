"""diagnostics/replay_sensitivity.py on a real finished workflow run."""

import subprocess
import sys

import polars as pl

from conftest import ROOT


def test_replay_sensitivity_full_replay_matches_the_logged_behavior(finished_run):
    workdir, cfg = finished_run
    steps = cfg["grpo"]["steps"]
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "diagnostics" / "replay_sensitivity.py"),
            "--config",
            str(workdir / "config.yaml"),
            "--seed",
            "0",
            "--steps",
            str(steps),
            "--every",
            str(steps),
            "--n-random",
            "3",
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = {line.split()[0]: line.split() for line in res.stdout.splitlines() if "left out" in line}
    assert set(lines) == {"full", "noise", "random"}
    assert lines["full"][3] == "0" and lines["random"][3] == "3"
    # Nothing left out: the same behavior rate as the logged last checkpoint under the same sampling (draw 0).
    logged = pl.read_parquet(workdir / "results" / cfg["run"] / "tables" / "headroom.parquet").filter(
        (pl.col("seed") == 0) & (pl.col("draw") == 0) & (pl.col("step") == steps)
    )["probe_rate"][0]
    assert float(lines["full"][4]) == round(logged, 3)
