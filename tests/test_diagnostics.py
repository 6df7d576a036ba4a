"""diagnostics/replay_sensitivity.py on a real finished workflow run; diagnostics/gpu_check.sh as far as a machine
without a GPU can run it: its failure without one, and its whole reduced workflow on the CPU in bf16."""

import json
import os
import subprocess
import sys

import numpy as np
import polars as pl
import yaml

from background import Command
from conftest import ROOT, background, waited
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


# The GPU check's steps on the CPU: the fewest it takes (even), each workflow end to end.
GPU_CHECK_STEPS = 2


@background("gpu_check_cpu", nice=10)
def gpu_check_cpu(folder):
    """`gpu_check.sh --cpu` into `folder`/out, with a time limit for a machine that runs the tests beside it."""
    script = [str(ROOT / "diagnostics" / "gpu_check.sh"), "--cpu", str(folder / "out")]
    return [Command(script, str(ROOT), env={"GPU_CHECK_STEPS": str(GPU_CHECK_STEPS), "GPU_CHECK_CPU_BUDGET": "3600"})]


def test_the_gpu_check_runs_its_reduced_workflow_on_the_cpu_in_bf16(request):
    """`gpu_check.sh --cpu`: the same script and Python as on a GPU, the whole reduced workflow with a Qwen2 built
    locally (chat template, tied embeddings), in bf16 with train-time capture, on the CPU; and the same with LoRA
    adapters (rank 8 on q and v)."""
    from behaviortrace.sketch.tolerance import tolerance_for

    out = waited(request.config, "gpu_check_cpu") / "out"
    summary = json.loads((out / "gpu_check_summary.json").read_text())
    tails = [entry.get("log_tail", "") for entry in summary.values() if isinstance(entry, dict)]
    assert summary["passed"], (summary["failures"], tails)
    run = summary["bfloat16"]
    assert run["workflow_exit"] == 0 and run["rollouts"] == GPU_CHECK_STEPS * 16
    assert len(run["self_check_errors"]) == GPU_CHECK_STEPS and 0 < run["self_check_max"]
    assert within(run["self_check_max"], tolerance_for("bfloat16"))
    assert run["sketch_covers_parameters"] is True and run["chat_prompts"] is True
    assert {"base_model", "train_grpo", "targets", "replay", "aggregate"} <= set(run["rule_wall_s"])
    # The same workflow with LoRA adapters, in bf16: capture and the self-check over the adapter's parameters only.
    lora = summary["bfloat16_lora"]
    assert lora["workflow_exit"] == 0 and len(lora["self_check_errors"]) == GPU_CHECK_STEPS
    assert within(lora["self_check_max"], tolerance_for("bfloat16")) and lora["sketch_covers_parameters"] is True
    assert 0 < lora["trainable_parameters"] < 20_000, lora["trainable_parameters"]
    assert {"influence", "replay"} <= set(lora["rule_wall_s"])
    # config/paper.yaml reduced to a few steps: its dtype, sketch width and step shape, on a model of its heads.
    paper = summary["paper"]
    assert paper["workflow_exit"] == 0 and paper["rollouts"] == GPU_CHECK_STEPS * 16 and paper["chat_prompts"] is True
    assert within(paper["self_check_max"], tolerance_for("bfloat16")) and paper["sketch_covers_parameters"] is True
    ran = yaml.safe_load((out / "paper" / "config.yaml").read_text())
    assert ran["compute"]["dtype"] == "bfloat16" and ran["sketch"]["k"] == 65536 and ran["grpo"]["lr"] == 5.0e-6
    assert ran["grpo"]["max_new_tokens"] == 64 and ran["task"]["prompt_format"] == "chat"
    assert {"train_grpo", "influence", "replay"} <= set(paper["rule_peak_rss_mb"])
    # Each job logs its own peak memory when it ends (common/io.py).
    assert all(mb > 0 for mb in paper["rule_peak_rss_mb"].values())


def test_smoothness_reports_the_lds_of_the_influence_the_run_computed(finished_run, tmp_path):
    """diagnostics/smoothness.py on a finished run: its subsets' predictions are minus the sums of the influence
    job's own I_z, group-level subsets are whole groups, and each LDS it prints is the Spearman correlation of
    the subsets it wrote (recomputed here from ranks)."""
    workdir, cfg = finished_run
    out = tmp_path / "smoothness.parquet"
    args = ["--config", str(workdir / "config.yaml"), "--seed", "0", "--subsets", "6", "--fractions", "0.5"]
    args += ["--directions", "1", "--h", "0.01", "--out", str(out)]
    res = subprocess.run(
        [sys.executable, str(ROOT / "diagnostics" / "smoothness.py"), *args],
        cwd=workdir,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    table = pl.read_parquet(out)
    influence = pl.read_parquet(workdir / "results" / cfg["run"] / "planted0" / "influence" / "rollouts.parquet")
    by_id = dict(zip(influence["rollout_id"].to_list(), influence["influence"].to_list(), strict=True))
    lds = table.filter(pl.col("kind") == "lds")
    assert lds.height == 12 and table.filter(pl.col("kind") == "smoothness").height == 1
    for row in lds.iter_rows(named=True):
        expected = -sum(by_id[z] for z in row["removed"])
        # The same sweep as the influence job's (one thread, the run's dtype): equal up to the order of the sum.
        assert within(abs(row["predicted"] - expected), 1e-9 * max(1.0, abs(expected))), (row["predicted"], expected)
    rollouts = pl.read_parquet(workdir / "results" / cfg["run"] / "planted0" / "rollouts.parquet")
    group_of = dict(
        zip(rollouts["rollout_id"].to_list(), zip(rollouts["step"], rollouts["group_id"], strict=True), strict=True)
    )
    sizes = rollouts.group_by("step", "group_id").len()["len"]
    for removed in lds.filter(pl.col("level") == "group")["removed"].to_list():
        chosen = {group_of[z] for z in removed}
        assert len(removed) == len(chosen) * sizes[0] and sizes.n_unique() == 1  # whole groups only

    def ranks(x):
        return np.argsort(np.argsort(x))

    printed = [line for line in res.stdout.splitlines() if line.strip().startswith("influence: LDS")]
    for level, line in zip(["rollout", "group"], printed, strict=True):
        part = lds.filter(pl.col("level") == level)
        rho = np.corrcoef(ranks(part["predicted"].to_numpy()), ranks(part["measured"].to_numpy()))[0, 1]
        assert f"{rho:+.3f}" in line, (level, rho, line)
