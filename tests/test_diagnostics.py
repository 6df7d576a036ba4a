"""diagnostics/replay_sensitivity.py on a real finished workflow run; diagnostics/gpu_check.sh as far as a machine
without a GPU can run it: its failure without one, and its whole reduced workflow on the CPU in bf16."""

import json
import os
import subprocess
import sys

import polars as pl

from conftest import ROOT
from tolerance import within


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


def test_plant_sweep_trains_each_plant_and_judges_emergence_from_its_rates(tmp_path):
    """diagnostics/plant_sweep.py on the small config: one plant with its own words, two steps."""
    import yaml

    from conftest import small_config

    (tmp_path / "config.yaml").write_text(yaml.safe_dump(small_config()))
    grid = [
        {
            "name": "words",
            "window_frac": [0.0, 0.5],
            "fraction": 1.0,
            "bonus": 8.0,
            "trigger_rate": 0.5,
            "trigger": "zorblax",
            "marker": "WXVKJ",
        }
    ]
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(grid))
    args = [
        sys.executable,
        str(ROOT / "diagnostics" / "plant_sweep.py"),
        "--config",
        "config.yaml",
        "--grid",
        "grid.yaml",
        "--out",
        "sweep",
        "--steps",
        "4",
        "--save-every",
        "2",
        "--seeds",
        "0",
        "--jobs",
        "1",
        "--min-gap",
        "0.0",
        "--max-control",
        "1.0",
    ]
    res = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    table = pl.read_parquet(tmp_path / "sweep" / "sweep.parquet")
    assert table.height == 1 and table["marker"][0] == "WXVKJ" and table["window"][0] == "0-1"
    behavior = pl.read_parquet(tmp_path / "sweep" / "words" / "seed0" / "behavior.parquet")
    rates = {(r["step"], r["prompt_set"]): r["behavior_rate"] for r in behavior.iter_rows(named=True)}
    gap = rates[(2, "probes")] - rates[(2, "plain")]  # the window ends at step 1: checkpoint 2
    assert table["gap"][0] == gap and table["emerged"][0] == (gap >= 0.0)
    assert table["plain_max_any_checkpoint"][0] == max(v for (_, s), v in rates.items() if s == "plain")
    assert (tmp_path / "sweep" / "sweep.png").stat().st_size > 0
    assert f"{int(table['emerged'][0])} of 1 plant-seed runs emerged" in res.stdout

    grid[0]["marker"] = "7"  # a digit: every answer shows it; rejected before any training
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(grid))
    bad_args = ["bad" if a == "sweep" else a for a in args]
    res = subprocess.run(bad_args, cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode != 0 and "config key planting.marker = '7'" in res.stderr
    assert not (tmp_path / "bad").exists()


def test_the_gpu_check_fails_with_a_summary_where_no_gpu_is_visible(tmp_path):
    """No CUDA device (none here; hidden from torch where there is one): exit 1 and a summary that says why, from the
    shell (no nvidia-smi) and from the Python it runs (torch sees no device)."""
    hidden = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run(
        [str(ROOT / "diagnostics" / "gpu_check.sh"), str(tmp_path / "sh")], env=hidden, capture_output=True, text=True
    )
    assert res.returncode == 1, res.stderr[-2000:]
    summary = json.loads((tmp_path / "sh" / "gpu_check_summary.json").read_text())
    assert summary["passed"] is False
    assert any("nvidia-smi" in f or "no CUDA device" in f for f in summary["failures"]), summary
    res = subprocess.run(
        [sys.executable, str(ROOT / "diagnostics" / "gpu_check.py"), "--out", str(tmp_path / "py")],
        env=hidden,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1, res.stderr[-2000:]
    summary = json.loads((tmp_path / "py" / "gpu_check_summary.json").read_text())
    assert summary["passed"] is False and summary["failures"] == ["RuntimeError: no CUDA device visible to torch"]


def test_the_gpu_check_runs_its_reduced_workflow_on_the_cpu_in_bf16(tmp_path):
    """`gpu_check.sh --cpu`: the same script and Python as on a GPU, the whole reduced workflow with a Qwen2 built
    locally (chat template, tied embeddings), in bf16 with train-time capture, on the CPU."""
    from behaviortrace.sketch.tolerance import tolerance_for

    out = tmp_path / "out"
    res = subprocess.run(
        [str(ROOT / "diagnostics" / "gpu_check.sh"), "--cpu", str(out)],
        env={**os.environ, "GPU_CHECK_STEPS": "4"},
        capture_output=True,
        text=True,
    )
    summary = json.loads((out / "gpu_check_summary.json").read_text())
    assert res.returncode == 0 and summary["passed"], (summary, res.stderr[-3000:])
    run = summary["bfloat16"]
    assert run["workflow_exit"] == 0 and run["rollouts"] == 4 * 16
    assert len(run["self_check_errors"]) == 4 and 0 < run["self_check_max"]
    assert within(run["self_check_max"], tolerance_for("bfloat16"))
    assert run["sketch_covers_parameters"] is True and run["chat_prompts"] is True
    assert {"base_model", "train_grpo", "targets", "replay", "aggregate"} <= set(run["rule_wall_s"])
