"""Can the exact influence of a finished run predict what removing data does? Metasmoothness and the LDS.

For one seed of a finished run (its rollouts, checkpoints, probes and config), with T as the run's
`influence.measure_at` or `--end` (a T where f still moves):

- I_z for every rollout before T (the influence job's reverse sweep, in the run's influence.dtype);
- metasmoothness along `--directions` random data-weight directions d (+-1 per rollout before T), at
  each step size h of `--h`: the second difference of f along d relative to the first,
  |f(+h) - 2 f(0) + f(-h)| / |f(+h) - f(-h)|. Zero where f is linear in the data weights along d at that
  scale (the derivative then predicts the change); near or above 1 where the curvature dominates;
- the linear datamodel score (LDS) of I: over `--subsets` random subsets of each `--fractions`, the
  Spearman correlation of the change I predicts for removing the subset (minus the sum of its I_z) with the
  change retraining measures (both under the run's influence.semantics), with a bootstrap interval over the
  subsets. At rollout level (subsets of rollouts) and group level (subsets of whole groups: the prompt
  was never sampled; a group's prediction is the sum of its members' I_z). Beside I, the same LDS for
  predictors that need no attribution: the paid count (a look-up of the reward), earlier-is-more (minus
  the step) and random scores.

Prints a table and, with `--out`, writes every retrained subset as Parquet.

    .venv/bin/python diagnostics/smoothness.py --seed 0 [--run default] [--config config/config.yaml] \\
        [--subsets 40] [--fractions 0.05 0.5] [--levels rollout group] [--directions 3] [--h 0.01 0.1]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import torch

from behaviortrace.common.seeds import cell_seed
from behaviortrace.configure import load
from behaviortrace.influence.inputs import end_step, run_inputs, setup
from behaviortrace.influence.lds import Resamples, interval
from behaviortrace.influence.metagradient import StateStore, exact_influence
from behaviortrace.influence.retrain import value_after
from behaviortrace.influence.sets import units as lds_units


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--run", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--subsets", type=int, default=40)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.05, 0.5])
    parser.add_argument("--levels", nargs="+", default=["rollout", "group"], choices=["rollout", "group"])
    parser.add_argument("--directions", type=int, default=3)
    parser.add_argument("--h", type=float, nargs="+", default=[0.01, 0.1])
    parser.add_argument("--end", type=int, default=None, help="T (default: the run's influence.measure_at)")
    parser.add_argument("--draw-seed", type=int, default=0, help="seed of the subsets and directions")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load(args.config)
    run_dir = Path("results") / (args.run or cfg.run)
    paths = run_inputs(run_dir, args.seed)
    end = args.end or end_step(cfg)
    if not 0 < end <= cfg.grpo.steps:
        parser.error(f"--end {end}: T must be a step of the run, 1 to grpo.steps = {cfg.grpo.steps}")
    traj, objective, _, rollouts, _ = setup(cfg, *paths, cfg.influence.dtype)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        started = time.time()
        store = StateStore(Path(tmp), "cpu")
        result = exact_influence(traj, objective, end, cfg.influence.segment_steps, store, set())
        seconds_influence = time.time() - started
        start = store.load(0)
        infl = dict(zip(result.rollout_ids.tolist(), result.influence.tolist(), strict=True))
        before = rollouts.filter(pl.col("step") < end).select("rollout_id", "step", "group_id", "paid")
        ids = before["rollout_id"].to_numpy()
        values = np.array([infl.get(int(z), 0.0) for z in ids])
        n_groups = len(lds_units(before, "group"))
        print(
            f"seed {args.seed}: T = {end}, {len(ids)} rollouts in {n_groups} groups before T, f(w_T) = "
            f"{result.f_end:.4f}; influence {seconds_influence:.0f} s; sum |I| {np.abs(values).sum():.3g}"
        )

        started = time.time()
        f0 = value_after(traj, start, {}, end, objective)
        seconds_replay = time.time() - started
        print(f"one replay: {seconds_replay:.1f} s; replayed f(w_T) {f0:.6f} (sweep {result.f_end:.6f})")

        for j in range(args.directions):
            rng = np.random.default_rng(cell_seed("smoothness_direction", args.draw_seed, args.seed, j))
            d = rng.choice([-1.0, 1.0], size=len(ids))
            slope = float(d @ values)
            for h in args.h:
                up = value_after(
                    traj, start, dict(zip(ids.tolist(), (1 + h * d).tolist(), strict=True)), end, objective
                )
                down = value_after(
                    traj, start, dict(zip(ids.tolist(), (1 - h * d).tolist(), strict=True)), end, objective
                )
                ratio = abs(up - 2 * f0 + down) / max(abs(up - down), 1e-300)
                rows.append(
                    {
                        "kind": "smoothness",
                        "level": "rollout",
                        "fraction": h,
                        "index": j,
                        "measured": up - f0,
                        "predicted": h * slope,
                        "extra": ratio,
                        "removed": [],
                    }
                )
                print(
                    f"direction {j}, h {h:g}: metasmoothness {ratio:.3g}; "
                    f"central difference {(up - down) / (2 * h):.4g} vs I.d {slope:.4g}"
                )

        # Predictors of a subset's change: I, and the controls that could explain an LDS without it.
        rng = np.random.default_rng(cell_seed("smoothness_random_scores", args.draw_seed, args.seed))
        scores = {
            "influence": values,
            "paid": before["paid"].cast(pl.Float64).to_numpy(),  # a look-up of the reward bonus
            "earlier": -before["step"].cast(pl.Float64).to_numpy(),  # earlier rollouts matter more
            "random": rng.standard_normal(len(ids)),
        }
        position = {int(z): i for i, z in enumerate(ids)}
        for level in args.levels:
            units = lds_units(before, level)
            for fraction in args.fractions:
                size = max(1, int(round(fraction * len(units))))
                measured, predicted = [], {name: [] for name in scores}
                for j in range(args.subsets):
                    rng = np.random.default_rng(
                        cell_seed("smoothness_lds", args.draw_seed, args.seed, level, fraction, j)
                    )
                    chosen = [z for u in rng.choice(len(units), size=size, replace=False) for z in units[u]]
                    f = value_after(traj, start, dict.fromkeys(chosen, 0.0), end, objective)
                    at = [position[z] for z in chosen]
                    row = {name: -float(s[at].sum()) for name, s in scores.items()}  # zeroing removes their sum
                    measured.append(f - f0)
                    for name, value in row.items():
                        predicted[name].append(value)
                    rows.append(
                        {
                            "kind": "lds",
                            "level": level,
                            "fraction": fraction,
                            "index": j,
                            "measured": f - f0,
                            "predicted": row["influence"],
                            "extra": float(len(chosen)),
                            "removed": chosen,
                        }
                    )
                measured = np.array(measured)
                pred = np.array(predicted["influence"])
                ratio = np.median(np.abs(pred) / np.maximum(np.abs(measured), 1e-300))
                print(
                    f"LDS {level} level, {fraction:.0%} ({size} units, {len(measured)} subsets): measured change "
                    f"median {np.median(measured):+.4g} (sd {measured.std():.3g}); |predicted by I| / |measured| "
                    f"median {ratio:.3g}"
                )
                resamples = Resamples(measured, 1000, args.draw_seed, "smoothness", args.seed, level, fraction)
                for name, values_ in predicted.items():
                    values_ = np.array(values_)
                    if np.ptp(values_) == 0:
                        print(f"  {name:>10}: constant over subsets")
                        continue
                    point, samples = resamples.lds(values_)
                    low, high = interval(samples)
                    print(f"  {name:>10}: LDS {point:+.3f} [{low:+.3f}, {high:+.3f}]")
    if args.out:
        pl.DataFrame(rows, schema_overrides={"removed": pl.List(pl.Int64)}).write_parquet(args.out)


if __name__ == "__main__":
    main()
