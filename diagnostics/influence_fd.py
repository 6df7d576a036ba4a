"""Check a finished run's exact influence against finite differences of real retraining, in float64.

For one seed: computes I_z again in float64 end to end (from the step-0 checkpoint, model/precision.py), then for
`--rollouts` rollouts from distinct seeded steps (the most influential of each step) retrains from that
step with the rollout's weight at 1 +- delta and compares the central difference with I_z, at
`--delta` and at ten times it (agreement between the two says delta is in the stable range), under the run's
influence.semantics or `--semantics` (docs/influence.md). It also
compares the run's own influence (results/{run}/planted{S}/influence/rollouts.parquet, in the run's
influence.dtype) with the float64 values: float32 replays drift from float64 ones (Adam amplifies
rounding), so the two differ by more than rounding.

    .venv/bin/python diagnostics/influence_fd.py --seed 0 --rollouts 5 [--run default] [--semantics held] \
        [--out fd.parquet]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import torch

from behaviortrace.configure import load
from behaviortrace.influence.inputs import end_step, run_inputs, setup
from behaviortrace.influence.metagradient import StateStore, exact_influence
from behaviortrace.influence.retrain import central_difference
from behaviortrace.influence.sets import fd_steps
from behaviortrace.influence.table import spearman


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--run", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rollouts", type=int, default=5)
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--semantics", choices=["advantages", "held"], default=None, help="default: the run's")
    parser.add_argument("--out", default=None, help="write the comparison as Parquet")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load(args.config)
    if args.semantics:
        cfg = dataclasses.replace(cfg, influence=dataclasses.replace(cfg.influence, semantics=args.semantics))
    semantics = cfg.influence.semantics
    run_dir = Path("results") / (args.run or cfg.run)
    paths = run_inputs(run_dir, args.seed)
    end = end_step(cfg)
    traj, objective, *_ = setup(cfg, *paths, "float64")
    movable = np.array([s for s in range(end) if len(traj.rows(s).rollout_ids)])
    steps = fd_steps(movable, args.rollouts, cfg.influence.seed, "diagnostic", args.seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        started = time.time()
        store = StateStore(Path(tmp), "cpu")
        result = exact_influence(traj, objective, end, end, store, set(steps))
        print(f"float64 influence of seed {args.seed}: {time.time() - started:.0f} s", flush=True)
        for step in steps:
            i = np.flatnonzero(result.steps == step)
            i = i[np.argmax(np.abs(result.influence[i]))]
            z = int(result.rollout_ids[i])
            fd, _ = central_difference(traj, store.load(step), z, args.delta, end, objective)
            coarse, _ = central_difference(traj, store.load(step), z, 10 * args.delta, end, objective)
            rows.append(
                {
                    "seed": args.seed,
                    "step": step,
                    "rollout_id": z,
                    "influence": result.influence[i],
                    "fd": fd,
                    "fd_10delta": coarse,
                    "relative_error": abs(result.influence[i] - fd) / abs(fd),
                }
            )
            print(
                f"step {step}, rollout {z}: I = {result.influence[i]:.6g}, central difference {fd:.6g} "
                f"(at 10 delta {coarse:.6g}), relative error {rows[-1]['relative_error']:.1e}",
                flush=True,
            )
    table = pl.DataFrame(rows).with_columns(delta=pl.lit(args.delta))
    own = run_dir / f"planted{args.seed}" / "influence" / "rollouts.parquet"
    if own.exists():
        shipped = pl.read_parquet(own).sort("rollout_id")[f"influence_{semantics}"].to_numpy()
        exact = pl.DataFrame({"rollout_id": result.rollout_ids, "i": result.influence}).sort("rollout_id")["i"]
        exact = exact.to_numpy()
        moved = exact != 0
        rel = np.abs(shipped - exact)[moved] / np.abs(exact[moved])
        top = min(100, len(exact) // 10)
        overlap = len(set(np.argsort(-shipped)[:top]) & set(np.argsort(-exact)[:top]))
        print(
            f"the run's influence ({semantics}) vs float64: Spearman {spearman(shipped, exact):.4f}, Pearson "
            f"{np.corrcoef(shipped, exact)[0, 1]:.4f}, median relative difference {np.median(rel):.1e}, "
            f"top-{top} overlap {overlap}/{top}"
        )
    print(table)
    if args.out:
        table.write_parquet(args.out)


if __name__ == "__main__":
    main()
