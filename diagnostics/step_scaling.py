"""Why a step's summed exact influence can miss what removing the step does: f(w_T) retrained with every share of
one step scaled by 1 - delta, for delta from a small nudge to the whole step removed, against the derivative's
prediction -delta * (sum of the step's I_z).

Where the curve is a line through the derivative, the step-level truth and I agree and either can judge step
scores. Where it bends, the derivative (all of a step's shares scaled together: under AdamW, whose update is
nearly invariant to the scale of a step's whole gradient, it is small) says little about removing the step (the
whole update gone), and only the measured leave-one-step-out can judge the step level.

For one seed of a finished run, at T as the run's influence.measure_at, over `--steps` steps spread before T:

    .venv/bin/python diagnostics/step_scaling.py --seed 0 [--run default] [--config results/default/config.yaml] \\
        [--steps 5] [--deltas 0.01 0.1 0.25 0.5 0.75 1] [--out scaling.parquet]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import torch

from behaviortrace.configure import load
from behaviortrace.influence.inputs import end_step, run_inputs, setup
from behaviortrace.influence.metagradient import StateStore, exact_influence
from behaviortrace.influence.retrain import value_after
from behaviortrace.influence.table import spearman


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--run", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--deltas", type=float, nargs="+", default=[0.01, 0.1, 0.25, 0.5, 0.75, 1.0])
    parser.add_argument("--out", default=None, help="write every retraining as Parquet")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load(args.config)
    paths = run_inputs(Path("results") / (args.run or cfg.run), args.seed)
    end = end_step(cfg)
    traj, objective, *_ = setup(cfg, *paths, cfg.influence.dtype)
    steps = sorted({int(s) for s in np.linspace(0, end - 1, min(args.steps, end)).round()})
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        started = time.time()
        store = StateStore(Path(tmp), "cpu")
        result = exact_influence(traj, objective, end, end, store, set(steps))
        base = value_after(traj, store.load(0), {}, end, objective)
        print(f"seed {args.seed}: I in {time.time() - started:.0f} s; T = {end}, f(w_T) = {base:.6g}", flush=True)
        for step in steps:
            ids = result.rollout_ids[result.steps == step]
            summed = float(result.influence[result.steps == step].sum())
            for delta in args.deltas:
                f = value_after(traj, store.load(step), {int(z): 1.0 - delta for z in ids}, end, objective)
                rows.append(
                    {
                        "seed": args.seed,
                        "step": step,
                        "delta": delta,
                        "measured": f - base,
                        "predicted": -delta * summed,
                        "sum_influence": summed,
                        "sum_abs_influence": float(np.abs(result.influence[result.steps == step]).sum()),
                    }
                )
            print(
                f"step {step}: sum I {summed:+.3e}; "
                + ", ".join(
                    f"d={r['delta']:g}: {r['measured']:+.3e} (pred {r['predicted']:+.3e})"
                    for r in rows[-len(args.deltas) :]
                ),
                flush=True,
            )
    table = pl.DataFrame(rows)
    print(
        "\nPer delta, over the steps: Spearman of the measured change with the derivative's prediction, and the ratio"
    )
    print("of the measured change to delta times the smallest delta's slope (1 where the curve is a line).")
    small = table.filter(pl.col("delta") == min(args.deltas)).select(
        "step", slope=pl.col("measured") / min(args.deltas)
    )
    for delta, part in table.join(small, on="step").group_by("delta", maintain_order=True):
        rho = spearman(part["predicted"].to_numpy(), part["measured"].to_numpy())
        ratio = (part["measured"] / (delta[0] * part["slope"])).to_numpy()
        median = float(np.median(ratio))
        print(f"delta {delta[0]:g}: Spearman(predicted, measured) {rho:+.2f}; measured / linear {median:.2f} (median)")
    if args.out:
        table.write_parquet(args.out)


if __name__ == "__main__":
    main()
