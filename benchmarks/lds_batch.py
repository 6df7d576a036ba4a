"""What batching the LDS retrainings saves: f(w_T) for the same LDS subsets (`--percent` of the rollouts before T
zeroed), one retraining at a time (influence/retrain.py) against B at a time (influence/batched.py), on a finished run's
seed, in the same process, in alternating rounds; ratios are of medians, so that a slower stretch of a shared
machine does not land on one side alone. One thread, the influence's dtype. The values must agree to rounding:
the script prints the largest difference and exits non-zero above 100 units in the last place of the largest |f|
(the two sum each step's gradient in another order).

    python benchmarks/lds_batch.py                                 # results/default, seed 0, B = 4 8 16
    python benchmarks/lds_batch.py --run smooth --config config/smooth.yaml --batches 8 32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import torch

ROOT = Path(__file__).resolve().parents[1]

from behaviortrace.configure import load  # noqa: E402
from behaviortrace.influence.batched import values_after  # noqa: E402
from behaviortrace.influence.inputs import end_step, run_inputs, setup  # noqa: E402
from behaviortrace.influence.retrain import value_after  # noqa: E402
from behaviortrace.influence.sets import lds_subsets, units  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "config" / "config.yaml"))
    parser.add_argument("--run", default=None, help="results/{run} (default: the config's run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--percent", type=int, default=50, help="subset size: percent of the rollouts before T")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load(args.config)
    run_dir = Path("results") / (args.run or cfg.run)
    end = end_step(cfg)
    traj, objective, _, rollouts, _ = setup(cfg, *run_inputs(run_dir, args.seed), cfg.influence.dtype)
    start = traj.state()
    n = max(args.batches)
    before = rollouts.filter(pl.col("step") < end)
    weights = [
        dict.fromkeys(s, 0.0)
        for s in lds_subsets(units(before, "rollout"), n, args.percent, 0, "planted", args.seed, "rollout")
    ]

    def plain():
        return [value_after(traj, start, w, end, objective) for w in weights]

    def batched(b):
        return [v for i in range(0, n, b) for v in values_after(traj, start, weights[i : i + b], end, objective)]

    variants = {"one at a time": plain} | {f"B = {b}": (lambda b=b: batched(b)) for b in args.batches}
    times, values = {name: [] for name in variants}, {}
    for round_ in range(args.rounds):
        for name, fn in variants.items():
            started = time.perf_counter()
            values[name] = fn()
            times[name].append(time.perf_counter() - started)
            print(f"round {round_ + 1}: {name}: {times[name][-1]:.1f} s for {n} retrainings", flush=True)
    base = statistics.median(times["one at a time"])
    reference = np.array(values["one at a time"])
    print(
        f"\n{run_dir}, seed {args.seed}: T = {end} steps, {before.height} rollouts before T, {args.percent}% zeroed, "
        f"P = {sum(p.numel() for p in traj.params)} parameters, {cfg.influence.dtype}; "
        f"medians of {args.rounds} rounds\n"
    )
    print("| variant | s per retraining | ratio to one at a time | largest difference in f |")
    print("|---|---|---|---|")
    worst = 0.0
    for name in variants:
        diff = float(np.abs(np.array(values[name]) - reference).max())
        worst = max(worst, diff)
        median = statistics.median(times[name])
        print(f"| {name} | {median / n:.2f} | {median / base:.2f} | {diff:.1e} |")
    spread, limit = float(np.ptp(reference)), 100 * torch.finfo(traj.dtype).eps * float(np.abs(reference).max())
    print(f"\nspread of f over the subsets {spread:.3e}; largest difference {worst:.1e} (limit {limit:.1e})")
    if worst > limit:
        sys.exit("batched and plain retraining disagree")


if __name__ == "__main__":
    main()
