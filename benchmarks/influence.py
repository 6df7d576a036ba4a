"""What the exact influence costs: the influence job's computation (forward sweep and reverse sweep) against a
plain replay of the same steps (the leave-out replay's own code, nothing left out), on a finished run's seed,
measured in the same process in alternating rounds; each ratio is of medians, so that a slower stretch of a
shared machine does not land on one side alone. One thread, the run's float32.

The last column but one is the influence job's own cost ratio (its `cost_ratio_cpu`): the forward sweep, the
recomputation and the reverse sweep (which takes I under both meanings of removal and its four parts) over the
forward sweep, in CPU seconds. Also the reverse sweep with shorter segments (recomputed from saved states, as
for a large model), and the memory the states take: with P trainable parameters, T steps and segment length M,
M states of 3P floats in memory and ceil(T / M) on disk; the time grows by the T - M recomputed steps.

    python benchmarks/influence.py                      # results/default, seed 0, 3 rounds
    python benchmarks/influence.py --run wf --seed 1 --rounds 2 --config path/to/config.yaml
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import polars as pl
import torch

ROOT = Path(__file__).resolve().parents[1]

from behaviortrace.common.device import resolve  # noqa: E402
from behaviortrace.configure import load  # noqa: E402
from behaviortrace.influence.inputs import end_step  # noqa: E402
from behaviortrace.influence.metagradient import StateStore, exact_influence  # noqa: E402
from behaviortrace.influence.objective import ForcedTarget  # noqa: E402
from behaviortrace.influence.trajectory import Trajectory  # noqa: E402
from behaviortrace.model import models  # noqa: E402
from behaviortrace.replay.retrain import replay_training  # noqa: E402
from behaviortrace.train.effect import ForcedTargetProbe  # noqa: E402


def timed(fn) -> tuple[float, float, object]:
    """Wall-clock and CPU seconds of fn(), and its result."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "config" / "config.yaml"))
    parser.add_argument("--run", default=None, help="results/{run} (default: the config's run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--segments", type=int, nargs="*", default=[10], help="shorter segment lengths to time")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load(args.config)
    run_dir = Path("results") / (args.run or cfg.run)
    seed_dir = run_dir / f"planted{args.seed}"
    device = resolve(cfg.compute)
    ckpt0 = Path(
        next(
            c["path"] for c in json.loads((seed_dir / "checkpoints.json").read_text())["checkpoints"] if c["step"] == 0
        )
    )
    rollouts = pl.read_parquet(seed_dir / "rollouts.parquet")
    probes = pl.read_parquet(run_dir / "data" / "probe_prompts.parquet")["prompt"].to_list()
    ref = models.load(run_dir / "base_model", device)[0].eval() if cfg.grpo.beta else None
    end, segment = end_step(cfg), cfg.influence.segment_steps

    def plain():
        model, tokenizer = models.load(ckpt0, device)
        return replay_training(model, ref, rollouts, cfg.grpo, set(), device, tokenizer.pad_token_id, stop_after=end)

    def influence(k: int):
        model, tokenizer = models.load(ckpt0, device)
        traj = Trajectory(model, ref, rollouts, cfg.grpo, device, tokenizer.pad_token_id, cfg.influence.semantics)
        objective = ForcedTarget(ForcedTargetProbe(tokenizer, probes, cfg.planting.marker, cfg.grpo.temperature))
        with tempfile.TemporaryDirectory() as tmp:
            return exact_influence(traj, objective, end, k, StateStore(Path(tmp), "cpu"))

    variants = {"plain replay": plain, f"influence, M = {segment}": lambda: influence(segment)}
    variants.update({f"influence, M = {k}": (lambda k=k: influence(k)) for k in args.segments if k < end})
    times = {name: [] for name in variants}
    parts = {name: [] for name in variants}
    for round_ in range(args.rounds):
        for name, fn in variants.items():
            wall, cpu, out = timed(fn)
            times[name].append((wall, cpu))
            if name != "plain replay":
                parts[name].append(out.seconds)
            print(f"round {round_ + 1}: {name}: {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
    base_wall = statistics.median(w for w, _ in times["plain replay"])
    base_cpu = statistics.median(c for _, c in times["plain replay"])
    params = sum(p.numel() for p in models.load(ckpt0, device)[0].parameters() if p.requires_grad)
    print(
        f"\n{run_dir}, seed {args.seed}: T = {end} steps, {rollouts.filter(pl.col('step') < end).height} rollouts, "
        f"P = {params} parameters; medians of {args.rounds} rounds\n"
    )
    header = ["variant", "wall s", "CPU s", "ratio (wall)", "ratio (CPU)", "forward s", "recompute s", "backward s"]
    print("| " + " | ".join([*header, "over its forward sweep (CPU)", "states in memory"]) + " |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in variants:
        wall = statistics.median(w for w, _ in times[name])
        cpu = statistics.median(c for _, c in times[name])
        cells = ["–"] * 3 + ["–", "–"]
        if parts[name]:
            k = segment if name.endswith(f"= {segment}") else int(name.rsplit("= ", 1)[1])
            cells = [
                f"{statistics.median(p[key] for p in parts[name]):.1f}" for key in ("forward", "recompute", "backward")
            ]
            # The influence job's own cost ratio (the table's cost_ratio_cpu): both meanings' I and their parts.
            spent = [
                (p["forward_cpu"] + p["recompute_cpu"] + p["backward_cpu"]) / p["forward_cpu"] for p in parts[name]
            ]
            cells.append(f"{statistics.median(spent):.2f}")
            cells.append(f"{min(k, end)} x 3P = {min(k, end) * 3 * params * 4 / 2**20:.1f} MiB")
        print(
            f"| {name} | {wall:.1f} | {cpu:.1f} | {wall / base_wall:.2f} | {cpu / base_cpu:.2f} | "
            + " | ".join(cells)
            + " |"
        )


if __name__ == "__main__":
    main()
