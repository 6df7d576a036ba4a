"""What every influence job starts from: T, the paths of a finished run's seed, and the replayed training at step 0
with the objective f (the forced target)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from behaviortrace.config.sections import Config
from behaviortrace.train.checkpoints import read_manifest


def end_step(cfg: Config) -> int:
    """T: the number of optimizer steps whose result f(w_T) is differentiated."""
    return cfg.influence.end_step(cfg.planting, cfg.grpo.steps)


def run_inputs(run_dir: Path, seed: int) -> tuple[Path, Path, Path, Path]:
    """What `setup` reads of a finished run's planted seed: its rollouts, checkpoints, base model and probes (for the
    diagnostics and benchmarks that replay a run outside the workflow)."""
    seed_dir = Path(run_dir) / f"planted{seed}"
    return (
        seed_dir / "rollouts.parquet",
        seed_dir / "checkpoints.json",
        Path(run_dir) / "base_model",
        Path(run_dir) / "data" / "probe_prompts.parquet",
    )


def setup(cfg: Config, rollouts_path: Path, checkpoints_path: Path, base_model: Path, probes_path: Path, dtype: str):
    """A trajectory at step 0 in `dtype` and the objective f, with the checkpoints, rollouts and device."""
    ckpts = read_manifest(checkpoints_path)[0]
    rollouts = pl.read_parquet(rollouts_path)
    probes = pl.read_parquet(probes_path)["prompt"].to_list()
    traj, objective, device = start(cfg, rollouts, ckpts[0], base_model, probes, cfg.planting.marker, dtype)
    return traj, objective, ckpts, rollouts, device


def start(
    cfg: Config, rollouts: pl.DataFrame, step0: Path, reference: Path, prompts: list[str], marker: str, dtype: str
):
    """The replayed training at the step-0 checkpoint `step0`, in `dtype`, with the KL term's reference model (the
    model at `reference`) where grpo.beta > 0, and f: the mean log-prob of `marker` right after each prompt (the
    forced target); with the device they run on."""
    import torch

    from behaviortrace.common import device as devices
    from behaviortrace.influence.objective import ForcedTarget
    from behaviortrace.influence.trajectory import Trajectory
    from behaviortrace.model import models
    from behaviortrace.train.effect import ForcedTargetProbe

    # The influence's own arithmetic: `dtype` takes compute.dtype's place, so nothing here runs under bf16 autocast
    # (common/device.py). A bf16 run's checkpoints hold float32 master weights, which the trajectory starts from
    # exactly; it differentiates training without the bf16 rounding of its passes, and its checks against the
    # checkpoints, the logged gradient norms and f(w_T) measure what that rounding moved (docs/influence.md).
    device = {**devices.resolve(cfg.compute), "dtype": dtype, "torch_dtype": getattr(torch, dtype)}
    model, tokenizer = models.load(step0, device)
    ref = models.load(reference, device)[0].eval() if cfg.grpo.beta else None
    traj = Trajectory(model, ref, rollouts, cfg.grpo, device, tokenizer.pad_token_id, cfg.influence.semantics)
    probe = ForcedTargetProbe(tokenizer, prompts, marker, cfg.grpo.temperature)
    return traj, ForcedTarget(probe), device
