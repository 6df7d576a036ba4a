"""Where the CPU time of one LDS retraining goes, per retrained step, and the ratio against another checkout.

    python benchmarks/retrain_step.py [--run default] [--seed 1] [--subsets 8] [--rounds 3] [--baseline PATH]

On a finished run's seed, retrains `--subsets` LDS subsets (5% of the rollouts before T, as the influence job draws
them) one at a time from the step-0 state, on one thread, and prints:

- the CPU seconds per retrained step (process time over the subsets, divided by T);
- where they go: the model's forward pass, the loss terms, the backward pass, gradient clipping, AdamW, the rest of
  the step (the data weights, the schedule), and per retraining the state's restore and f(w_T), from timers put
  around those calls in this process (the library is not changed for it);
- with `--baseline PATH` (another checkout, for example a `git worktree` of an older commit), the same retraining in
  fresh processes with each checkout's package first on the path, in alternating rounds: the ratio of the medians,
  and whether f(w_T) of every subset is equal to the bit.

Run it from the folder that holds results/ (the checkpoint manifest's paths are relative to it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh process with one package first on the path: retrains the subsets, prints JSON (CPU seconds per
# retrained step, the f values, and with "parts" the split).
JOB = """
import json, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
import polars as pl
from behaviortrace.configure import load
from behaviortrace.influence.inputs import end_step, run_inputs, setup
from behaviortrace.influence.retrain import value_after
from behaviortrace.influence.sets import lds_subsets, units

run, seed, n, parts = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "parts"
cfg = load(str(run / "config.yaml"))
end = end_step(cfg)
traj, objective, _, rollouts, _ = setup(cfg, *run_inputs(run, seed), cfg.influence.dtype)
start = traj.state()
before = rollouts.filter(pl.col("step") < end)
subsets = lds_subsets(units(before, "rollout"), n, 5, cfg.influence.seed, "planted", seed, "rollout")
spent = {}

def timed(name, fn):
    def wrapper(*args, **kwargs):
        began = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.process_time() - began
    return wrapper

if parts:
    marks = {}

    def forward_began(*_):
        marks["forward"] = time.process_time()

    def forward_ended(*_):
        if marks.get("in_step"):  # f(w_T)'s forward passes count in f
            spent["forward"] = spent.get("forward", 0.0) + time.process_time() - marks["forward"]

    traj.model.register_forward_pre_hook(forward_began)
    traj.model.register_forward_hook(forward_ended)
    step = traj.step

    def in_step(*args, **kwargs):
        marks["in_step"] = True
        try:
            return step(*args, **kwargs)
        finally:
            marks["in_step"] = False

    traj.step = in_step
    traj.losses = timed("loss", traj.losses)
    torch.Tensor.backward = timed("backward", torch.Tensor.backward)
    torch.nn.utils.clip_grad_norm_ = timed("clip", torch.nn.utils.clip_grad_norm_)
    traj.optimizer.step = timed("optimizer", traj.optimizer.step)
    traj.restore = timed("restore", traj.restore)
    objective.value = timed("f", objective.value)
    traj.step = timed("step", traj.step)
value_after(traj, start, dict.fromkeys(subsets[0], 0.0), end, objective)  # warm-up, not counted
spent.clear()
began = time.process_time()
values = [value_after(traj, start, dict.fromkeys(s, 0.0), end, objective) for s in subsets]
total = time.process_time() - began
print(json.dumps({"per_step": total / n / end, "total": total, "values": values, "spent": spent, "end": end, "n": n,
                  "rollouts": before.height}))
"""


def measure(src: Path, run: Path, seed: int, n: int, parts: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", JOB, str(run), str(seed), str(n), "parts" if parts else "plain"],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        sys.exit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def split_table(found: dict) -> str:
    """The split of the CPU time per retrained step (ms), from a run with the timers."""
    spent, steps = found["spent"], found["n"] * found["end"]
    inside = ["forward", "loss", "backward", "clip", "optimizer"]
    rows = [(name, spent.get(name, 0.0)) for name in inside]
    rows.append(("rest of the step (data weights, schedule, Python)", spent["step"] - sum(v for _, v in rows)))
    rows += [("restore the state (per retraining)", spent["restore"]), ("f(w_T) (per retraining)", spent["f"])]
    rows.append(("rest of the retraining", found["total"] - spent["step"] - spent["restore"] - spent["f"]))
    lines = ["| part | CPU ms per retrained step | share |", "|---|---|---|"]
    lines += [f"| {name} | {1000 * v / steps:.1f} | {v / found['total']:.1%} |" for name, v in rows]
    lines.append(f"| all | {1000 * found['total'] / steps:.1f} | 100% |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="default")
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--subsets", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path, help="another checkout, timed against this one")
    args = ap.parse_args()
    run = args.results / args.run
    found = measure(ROOT / "src", run, args.seed, args.subsets, parts=True)
    print(
        f"{run}, planted{args.seed}: {args.subsets} LDS subsets of 5% of the {found['rollouts']} rollouts before "
        f"T = {found['end']}, one thread\n"
    )
    print(split_table(found))
    if args.baseline is None:
        return
    times = {"this": [], "baseline": []}
    values = {}
    for _ in range(args.rounds):
        for role, src in (("baseline", args.baseline / "src"), ("this", ROOT / "src")):
            result = measure(src, run, args.seed, args.subsets, parts=False)
            times[role].append(result["per_step"])
            values[role] = result["values"]
    this, base = statistics.median(times["this"]), statistics.median(times["baseline"])
    same = values["this"] == values["baseline"]
    print(
        f"\nCPU per retrained step, medians of {args.rounds} rounds: baseline {1000 * base:.1f} ms, this "
        f"{1000 * this:.1f} ms; baseline / this: {base / this:.2f}; f(w_T) of every subset "
        f"{'equal to the bit' if same else 'DIFFERS'}"
    )


if __name__ == "__main__":
    main()
