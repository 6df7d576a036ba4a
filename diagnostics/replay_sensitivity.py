"""How sensitive is the leave-out replay of a finished run to small changes?

The causal check compares leaving out an estimator's top k against leaving out k at random. That
comparison only means something if the replay responds smoothly: if leaving out a handful of ordinary
rollouts already undoes the behavior, every removal looks causal. This replays the first `--steps`
logged steps of one seed several ways and prints the probe behavior rate every `--every` steps:

  full         nothing left out (reproduces the logged training)
  noise        nothing left out, Gaussian noise of sd `--noise` added to every step-0 weight
  random       `--n-random` rollouts of those steps left out at random (seeded by `--removal-seed`)
  ids          the rollout ids given with `--ids` left out
  *_nokl       the same with the KL term dropped from the replay (set `--no-kl`)

Usage (from the repository root, after `make run`):
  .venv/bin/python diagnostics/replay_sensitivity.py --seed 0 --steps 60 --n-random 153 --ids 544 644
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import polars as pl
import torch

from behaviortrace.behavior.rates import behavior_rates
from behaviortrace.common.device import resolve
from behaviortrace.config.sections import Compute, Config
from behaviortrace.configure import load as load_config
from behaviortrace.model import models
from behaviortrace.replay.removal import random_set
from behaviortrace.replay.retrain import replay_training
from behaviortrace.train.checkpoints import read_manifest


def replay_rates(
    cfg: Config, run_dir: Path, seed: int, steps: int, every: int, removed: set[int], noise: float, beta: float
) -> list[float]:
    """Probe behavior rate every `every` steps of a replay of the first `steps` steps, sampled as the
    replay rule samples (targets draw 0)."""
    dev = resolve(Compute(device="cpu", dtype="float32"))
    ckpts, _ = read_manifest(run_dir / f"planted{seed}" / "checkpoints.json")
    model, tokenizer = models.load(ckpts[0], dev)
    if noise:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * noise)
    ref = models.load(run_dir / "base_model", dev)[0].eval() if beta else None
    rollouts = pl.read_parquet(run_dir / f"planted{seed}" / "rollouts.parquet").filter(pl.col("step") < steps)
    probes = pl.read_parquet(run_dir / "data" / "probe_prompts.parquet")
    rates = []

    def measure(step: int, m) -> None:
        if step % every == 0:
            m.eval()
            with torch.no_grad():
                row = behavior_rates(
                    m,
                    tokenizer,
                    {"probes": probes},
                    cfg.planting.marker,
                    cfg.task.base_reward,
                    cfg.targets.samples_per_prompt,
                    cfg.grpo.sampling,
                    cfg.targets.draw_seed(0),
                )[0]
            m.train()
            rates.append(row["behavior_rate"])

    grpo = dataclasses.replace(cfg.grpo, steps=steps, beta=beta)
    replay_training(model, ref, rollouts, grpo, removed, dev, tokenizer.pad_token_id, measure)
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="config/config.yaml")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--noise", type=float, default=1e-4)
    ap.add_argument("--n-random", type=int, default=0)
    ap.add_argument("--removal-seed", type=int, default=7)
    ap.add_argument("--ids", type=int, nargs="*", default=[])
    ap.add_argument("--no-kl", action="store_true", help="also replay every variant without the KL term")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(args.config)
    run_dir = Path("results") / cfg.run
    rollouts = pl.read_parquet(run_dir / f"planted{args.seed}" / "rollouts.parquet").filter(pl.col("step") < args.steps)
    variants = {"full": (set(), 0.0), "noise": (set(), args.noise)}
    if args.n_random:
        variants["random"] = (random_set(rollouts["rollout_id"].to_numpy(), args.n_random, args.removal_seed), 0.0)
    if args.ids:
        variants["ids"] = (set(args.ids), 0.0)
    betas = {"": cfg.grpo.beta, **({"_nokl": 0.0} if args.no_kl and cfg.grpo.beta else {})}
    print(
        f"seed {args.seed}, first {args.steps} steps ({rollouts.height} rollouts); probe behavior rate at steps "
        f"{list(range(args.every, args.steps + 1, args.every))}",
        flush=True,
    )
    for suffix, beta in betas.items():
        for name, (removed, noise) in variants.items():
            rates = replay_rates(cfg, run_dir, args.seed, args.steps, args.every, removed, noise, beta)
            print(
                f"{name + suffix:<12} left out {len(removed):>5}  " + "  ".join(f"{r:.3f}" for r in rates), flush=True
            )


if __name__ == "__main__":
    main()
