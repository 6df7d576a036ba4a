"""What a finished training run leaves for every later stage: its rollout log, its step log and the manifest of its
checkpoints, each checked complete (the workflow's training job and api.py's capture both end here)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from behaviortrace.common.io import atomic_write_parquet
from behaviortrace.train.checkpoints import complete_checkpoints, write_manifest
from behaviortrace.train.effect import values_after_and_changes
from behaviortrace.train.optimizer_log import preconditioner_path
from behaviortrace.train.rolloutlog import RolloutLog


def finalize(
    train_dir: Path,
    steps: int,
    batch: int,
    rollouts_path: Path,
    steps_path: Path,
    manifest_path: Path,
    saved: list[int],
    final_target_logprob: float,
) -> pl.DataFrame:
    """Join the parts, check that every rollout of every step is there exactly once, write the outputs.

    The step log gains each step's measured effect (train/effect.py): the forced target after the step's
    update and the change; the manifest names each checkpoint's AdamW second moment (train/optimizer_log.py).
    """
    rollout_log = RolloutLog(Path(train_dir) / "parts")
    rollouts, step_info = rollout_log.read("rollouts"), rollout_log.read("steps")
    expected = steps * batch
    if rollouts.height != expected or rollouts["rollout_id"].n_unique() != expected:
        raise RuntimeError(
            f"rollout log has {rollouts.height} rows ({rollouts['rollout_id'].n_unique()} distinct), "
            f"expected {expected}"
        )
    if step_info["step"].to_list() != list(range(steps)):
        raise RuntimeError("step log does not hold each step exactly once")
    found = complete_checkpoints(Path(train_dir))
    missing = [s for s in saved if s not in found]
    if missing:
        raise RuntimeError(f"checkpoints missing for steps {missing}")
    adam = {s: preconditioner_path(train_dir, s) for s in saved if s < steps}
    missing = [s for s, path in adam.items() if not path.exists()]
    if missing:
        raise RuntimeError(f"AdamW second moments missing for checkpoint steps {missing}")
    after, change = values_after_and_changes(step_info["target_logprob"].to_list(), final_target_logprob)
    step_info = step_info.with_columns(
        target_logprob_after=pl.Series(after, dtype=pl.Float64), target_change=pl.Series(change, dtype=pl.Float64)
    )
    atomic_write_parquet(rollouts, rollouts_path)
    atomic_write_parquet(step_info, steps_path)
    write_manifest(manifest_path, {s: found[s] for s in saved}, adam)
    return rollouts


# How the training log reports the job's peak GPU memory (diagnostics/gpu_check.py reads it).
PEAK_GPU_MEMORY = "peak GPU memory allocated by training:"
