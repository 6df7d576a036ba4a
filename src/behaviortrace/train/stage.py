"""Rule train_grpo: GRPO for one seed, logging every rollout (and, with `sketch.mode: train`, sketching
them as they are trained on); resumes from its last checkpoint."""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from behaviortrace.common import device as devices
from behaviortrace.common.io import atomic_write_parquet
from behaviortrace.config.sections import Config
from behaviortrace.model import models
from behaviortrace.train import grpo
from behaviortrace.train.checkpoints import complete_checkpoints, write_manifest
from behaviortrace.train.effect import values_after_and_changes
from behaviortrace.train.optimizer_log import preconditioner_path
from behaviortrace.train.rolloutlog import RolloutLog

log = logging.getLogger(__name__)
# How the training log reports the job's peak GPU memory (diagnostics/gpu_check.py reads it).
PEAK_GPU_MEMORY = "peak GPU memory allocated by training:"


def train_job(
    cfg: Config,
    *,
    seed: int,
    base_model: Path,
    prompts: Path,
    probes: Path,
    train_dir: Path,
    rollouts_path: Path,
    steps_path: Path,
    manifest_path: Path,
    shards: list[Path] = (),
) -> pl.DataFrame:
    """Train one seed (resuming where a killed job stopped) and write its rollout log, step log and manifest;
    with `sketch.mode: train`, also its sketch stores (`shards`, one per shard of steps, in order)."""
    device = devices.resolve(cfg.compute)
    model, tokenizer = training_model(cfg, base_model, device, seed)
    check_disk(cfg, model, Path(train_dir))
    fingerprint = grpo.run_fingerprint(cfg.to_dict(), seed, [base_model, prompts])
    capture_dir = Path(train_dir) / "capture"
    captures = cfg.has("sketch") and cfg.sketch.mode == "train"
    factory = capture_factory(cfg, model, tokenizer, base_model, device, capture_dir, fingerprint) if captures else None
    info = grpo.train(
        model,
        tokenizer,
        pl.read_parquet(prompts),
        cfg,
        seed,
        train_dir,
        device,
        fingerprint,
        capture_factory=factory,
        probes=pl.read_parquet(probes),
    )
    rollouts = finalize(
        train_dir,
        cfg.grpo.steps,
        info["batch_size"],
        rollouts_path,
        steps_path,
        manifest_path,
        info["saved_steps"],
        info["final_target_logprob"],
    )
    if factory is not None:
        from behaviortrace.sketch.capture import publish

        for shard, out in enumerate(shards):
            publish(capture_dir, shard, out)
    log.info("seed %d: %d rollouts logged, %d paid", seed, rollouts.height, int(rollouts["paid"].sum()))
    if device["use_cuda"]:
        import torch

        log.info("%s %.0f MiB", PEAK_GPU_MEMORY, torch.cuda.max_memory_allocated() / 2**20)
    return rollouts


def check_disk(cfg: Config, model, train_dir: Path) -> None:
    """Every checkpoint still to save holds the trainable weights in float32 and AdamW's second moment (8 bytes per
    parameter), and the newest also the whole optimizer state (8 more, twice while it is replaced): refused before
    the first step where the disk cannot hold them."""
    from behaviortrace.common.disk import require_free_disk
    from behaviortrace.train.checkpoints import saved_steps

    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    done = complete_checkpoints(train_dir) if train_dir.exists() else {}
    saves = saved_steps(cfg.grpo.steps, cfg.grpo.save_every, cfg.planting.end_checkpoint(cfg.grpo.steps))
    left = sum(s not in done for s in saves)
    need = 8 * params * left + 16 * params
    what = f"{left} checkpoints of {params:,} trainable parameters (8 bytes each per checkpoint, 16 for the optimizer)"
    require_free_disk(train_dir, need, what, "grpo.save_every (fewer checkpoints)")


def training_model(cfg: Config, base_model: Path, device: dict, seed: int):
    """The model TRL trains: the base model, or with `model.lora` the base model under fresh adapters (drawn with the
    training `seed`), checked (sketch/preflight.py) like the base model was, since the adapters are modules of
    their own."""
    model, tokenizer = models.load(base_model, device)
    if cfg.model.lora.enabled:
        from behaviortrace.model import lora
        from behaviortrace.sketch.preflight import capture_tolerance, check_capture

        model = lora.wrap(model, cfg.model.lora, base_model, seed)
        check_capture(model, tokenizer.pad_token_id, capture_tolerance(model), f"{cfg.model.name} with LoRA")
    return model, tokenizer


def capture_factory(cfg: Config, model, tokenizer, base_model: Path, device: dict, folder: Path, fingerprint: str):
    """What `grpo.train` calls to make the train-time capture (sketch/capture.py) of this run."""
    from behaviortrace.sketch.capture import TrainCapture

    ref = models.load(base_model, device)[0].eval() if cfg.grpo.beta else None

    def make(saved: list[int]):
        return TrainCapture(cfg, model, tokenizer, ref, folder, saved, fingerprint, device)

    return make


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
