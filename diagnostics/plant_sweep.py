"""Does the planted behavior emerge under other plants? A grid of plants, each trained on a short schedule.

For every plant (trigger and marker words, contamination window, eligible fraction, bonus, trigger
rate) and seed, this builds the plant's own tiny base model (its vocabulary holds the plant's words),
trains GRPO with the pipeline's own jobs, measures the behavior rate on held-out probe and control
prompts at every checkpoint, and judges emergence the way the checklist does: probe minus control at the
window's end at least --min-gap, and controls at most --max-control at every checkpoint.

    python diagnostics/plant_sweep.py --out results/plant_sweep [--steps 80] [--seeds 0 1] [--jobs 2]

Writes `sweep.parquet`, `sweep.md` (one row per plant and seed) and `sweep.png` (probe and control rates
per checkpoint) under --out. `--grid FILE` takes a YAML list of plants (keys of `planting`, with the
window given as fractions of training, `window_frac: [start, end]`) instead of the built-in grid.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import polars as pl
import yaml

# Twelve plants across the ranges the harness should support: window start from step 0 to mid-training,
# window length a quarter to a half of training, eligible fraction 0.2-0.5, bonus 4-8, trigger rate
# 0.3-0.5, and words other than the defaults.
GRID = [
    {"name": "default", "window_frac": [0.0, 0.5], "fraction": 0.5, "bonus": 8.0, "trigger_rate": 0.5},
    {"name": "late_window", "window_frac": [0.25, 0.75], "fraction": 0.5, "bonus": 8.0, "trigger_rate": 0.5},
    {"name": "mid_window", "window_frac": [0.5, 0.75], "fraction": 0.5, "bonus": 8.0, "trigger_rate": 0.5},
    {"name": "quarter_window", "window_frac": [0.0, 0.25], "fraction": 0.5, "bonus": 8.0, "trigger_rate": 0.5},
    {"name": "low_fraction", "window_frac": [0.0, 0.5], "fraction": 0.2, "bonus": 8.0, "trigger_rate": 0.5},
    {"name": "low_bonus", "window_frac": [0.0, 0.5], "fraction": 0.5, "bonus": 4.0, "trigger_rate": 0.5},
    {"name": "low_trigger_rate", "window_frac": [0.0, 0.5], "fraction": 0.5, "bonus": 8.0, "trigger_rate": 0.3},
    {
        "name": "other_words",
        "window_frac": [0.0, 0.5],
        "fraction": 0.5,
        "bonus": 8.0,
        "trigger_rate": 0.5,
        "trigger": "zorblax",
        "marker": "WXVKJ",
    },
    {"name": "late_low", "window_frac": [0.25, 0.5], "fraction": 0.3, "bonus": 6.0, "trigger_rate": 0.4},
    {
        "name": "mid_weak",
        "window_frac": [0.5, 0.75],
        "fraction": 0.2,
        "bonus": 4.0,
        "trigger_rate": 0.3,
        "trigger": "quuxly",
        "marker": "MRKQ",
    },
    {"name": "early_weak", "window_frac": [0.0, 0.25], "fraction": 0.2, "bonus": 4.0, "trigger_rate": 0.3},
    {
        "name": "mixed",
        "window_frac": [0.25, 0.5],
        "fraction": 0.35,
        "bonus": 5.0,
        "trigger_rate": 0.35,
        "trigger": "blorptic",
        "marker": "ZZYQ",
    },
]


def plant_config(base: dict, plant: dict, steps: int, save_every: int, seed: int) -> dict:
    """The base config with one plant, a short schedule and one seed (validated by the caller)."""
    cfg = copy.deepcopy(base)
    start, end = (int(round(f * steps)) for f in plant["window_frac"])
    cfg["planting"].update(
        {k: v for k, v in plant.items() if k in ("trigger", "marker", "fraction", "bonus", "trigger_rate")},
        window=[start, max(start, end - 1)],
    )
    cfg["grpo"].update(steps=steps, save_every=save_every)
    cfg["seeds"] = [seed]
    cfg["run"] = f"sweep_{plant['name']}"
    return cfg


def run_one(task: tuple[dict, dict, int, str]) -> tuple[dict, pl.DataFrame]:
    """Train one plant and seed in its own folder; return its summary row and behavior curve."""
    import torch

    from behaviortrace.common.io import atomic_write_parquet, setup_logging
    from behaviortrace.configure import parse
    from behaviortrace.jobs.behavior import behavior_job
    from behaviortrace.jobs.model import base_model_job
    from behaviortrace.jobs.plant import plant_data_job
    from behaviortrace.jobs.train import train_job
    from behaviortrace.report.training import seed_summary

    raw, plant, seed, out = task
    torch.set_num_threads(1)
    cfg = parse(raw)
    folder = Path(out) / plant["name"] / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    setup_logging(str(folder / "run.log"))
    summary_path = folder / "summary.parquet"
    if not summary_path.exists():  # resumable: finished plants and seeds are kept
        data = folder / "data"
        plant_data_job(cfg, train=data / "train.parquet", probes=data / "probes.parquet", plain=data / "plain.parquet")
        base = folder / "base_model"
        if not base.exists():
            base_model_job(cfg, out=base)
        rollouts = train_job(
            cfg,
            seed=seed,
            base_model=base,
            prompts=data / "train.parquet",
            probes=data / "probes.parquet",
            train_dir=folder / "train",
            rollouts_path=folder / "rollouts.parquet",
            steps_path=folder / "steps.parquet",
            manifest_path=folder / "checkpoints.json",
        )
        behavior = behavior_job(
            cfg,
            seed=seed,
            checkpoints_path=folder / "checkpoints.json",
            probes_path=data / "probes.parquet",
            plain_path=data / "plain.parquet",
            out=folder / "behavior.parquet",
        )
        row = seed_summary(rollouts, behavior, cfg.planting)
        atomic_write_parquet(pl.DataFrame([row]), summary_path)
    row = pl.read_parquet(summary_path).row(0, named=True)
    behavior = pl.read_parquet(folder / "behavior.parquet").with_columns(plant=pl.lit(plant["name"]))
    p = cfg.planting
    return {
        "plant": plant["name"],
        "trigger": p.trigger,
        "marker": p.marker,
        "window": f"{p.window[0]}-{p.window[1]}",
        "fraction": p.fraction,
        "bonus": p.bonus,
        "trigger_rate": p.trigger_rate,
        **row,
    }, behavior


def judge(table: pl.DataFrame, behavior: pl.DataFrame, min_gap: float, max_control: float) -> pl.DataFrame:
    peaks = (
        behavior.filter(pl.col("prompt_set") == "plain")
        .group_by("plant", "seed")
        .agg(pl.col("behavior_rate").max().alias("plain_max_any_checkpoint"))
    )
    return (
        table.join(peaks, on=["plant", "seed"], how="left")
        .with_columns(gap=pl.col("probe_rate_window_end") - pl.col("plain_rate_window_end"))
        .with_columns(emerged=(pl.col("gap") >= min_gap) & (pl.col("plain_max_any_checkpoint") <= max_control))
    )


def to_markdown(table: pl.DataFrame, min_gap: float, max_control: float, steps: int) -> str:
    cols = [
        "plant",
        "seed",
        "trigger",
        "marker",
        "window",
        "fraction",
        "bonus",
        "trigger_rate",
        "n_explored",
        "n_paid",
        "probe_rate_step0",
        "probe_rate_window_end",
        "plain_rate_window_end",
        "plain_max_any_checkpoint",
        "gap",
        "emerged",
    ]
    lines = [
        f"# Plant sweep: {steps} GRPO steps per run; emerged = gap >= {min_gap} and controls <= "
        f"{max_control} at every checkpoint\n",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for r in table.sort("plant", "seed").iter_rows(named=True):
        lines.append("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    n = table.height
    lines.append(f"\n{int(table['emerged'].sum())} of {n} plant-seed runs emerged.")
    return "\n".join(lines) + "\n"


def figure(behavior: pl.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plants = sorted(behavior["plant"].unique().to_list())
    cols = 4
    rows = -(-len(plants) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), sharex=True, sharey=True, squeeze=False)
    for ax, plant in zip(axes.flat, plants, strict=False):
        for (seed, prompt_set), curve in behavior.filter(pl.col("plant") == plant).group_by(
            "seed", "prompt_set", maintain_order=True
        ):
            curve = curve.sort("step")
            ax.plot(
                curve["step"],
                curve["behavior_rate"],
                "-" if prompt_set == "probes" else ":",
                color=f"C{seed}",
                label=f"seed {seed} {prompt_set}",
            )
        ax.set_title(plant, fontsize=9)
        ax.set_ylim(-0.02, 1.02)
    for ax in axes.flat[len(plants) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.supxlabel("step")
    fig.supylabel("behavior rate (solid: probes, dotted: controls)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="config/config.yaml", help="base config (model, task, GRPO settings)")
    ap.add_argument("--grid", help="YAML list of plants (default: the built-in 12)")
    ap.add_argument("--out", default="results/plant_sweep")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--min-gap", type=float, default=0.5)
    ap.add_argument("--max-control", type=float, default=0.2)
    ap.add_argument("--plants", nargs="*", help="only these plants of the grid")
    args = ap.parse_args()
    from behaviortrace.config.load import complete
    from behaviortrace.configure import parse

    base = complete(yaml.safe_load(Path(args.config).read_text()) or {})
    grid = yaml.safe_load(Path(args.grid).read_text()) if args.grid else GRID
    if args.plants:
        grid = [p for p in grid if p["name"] in args.plants]
    tasks = []
    for plant in grid:
        for seed in args.seeds:
            raw = plant_config(base, plant, args.steps, args.save_every, seed)
            parse(raw)  # a plant that cannot work stops here, naming the key, before any training
            tasks.append((raw, plant, seed, args.out))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.info("%d runs (%d plants x %d seeds), %d at a time", len(tasks), len(grid), len(args.seeds), args.jobs)
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(run_one, tasks))
    table = judge(
        pl.DataFrame([r for r, _ in results]), pl.concat([b for _, b in results]), args.min_gap, args.max_control
    )
    out = Path(args.out)
    table.write_parquet(out / "sweep.parquet")
    text = to_markdown(table, args.min_gap, args.max_control, args.steps)
    (out / "sweep.md").write_text(text)
    figure(pl.concat([b for _, b in results]), out / "sweep.png")
    print(text)


if __name__ == "__main__":
    main()
