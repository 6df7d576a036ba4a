"""Leave-out replay: retrain a seed from its step-0 checkpoint on its logged rollouts, with a set of rollouts
left out as if they had never been sampled, and measure the behavior it ends up with.

The replay repeats what TRL did at each step (trl 1.16, on-policy, one optimizer step per generation
batch): the same rollouts in the same order, the group advantages recomputed from the logged rewards
with the left-out rollouts dropped from their groups (TRL's NaN-aware group mean and std), the same
per-token loss and normalization (rollout_loss.py), the same optimizer, learning-rate schedule and
gradient clipping (built by transformers' own Trainer from the same arguments). With nothing left out
it reproduces the logged training's weights; a test checks that.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import torch

from .rollout_loss import batch_to, completion_logps, pad_batch, rollout_losses

log = logging.getLogger(__name__)


def replay_advantages(rewards: np.ndarray, groups: np.ndarray, keep: np.ndarray, scale_rewards: str) -> np.ndarray:
    """TRL's advantages of one step with the rows where `keep` is False dropped from their groups.

    Dropped rows count as unscorable (NaN): they leave the group mean and standard deviation, as TRL
    treats a completion no reward function scored. A group left with one rollout has no spread and gets
    advantage 0. Returned for every row (dropped rows: 0).
    """
    r = torch.tensor(np.where(keep, rewards, np.nan), dtype=torch.float32)
    g = torch.tensor(np.asarray(groups))
    mean = torch.zeros_like(r)
    std = torch.zeros_like(r)
    for gid in torch.unique(g):
        idx = g == gid
        mean[idx] = torch.nanmean(r[idx])
        if scale_rewards == "group":
            std[idx] = _nanstd(r[idx])
    if scale_rewards == "batch":
        std[:] = _nanstd(r)
    adv = r - mean
    if scale_rewards != "none":
        adv = adv / (std + 1e-4)
    return torch.nan_to_num(adv, nan=0.0).numpy().astype(np.float64) * keep


def _nanstd(x: torch.Tensor) -> torch.Tensor:
    """Bessel-corrected standard deviation over the non-NaN values; NaN for fewer than two."""
    n = int((~torch.isnan(x)).sum())
    if n < 2:
        return torch.tensor(float("nan"))
    mean = torch.nanmean(x)
    return torch.sqrt(torch.nanmean((x - mean) ** 2) * n / (n - 1))


def optimizer_and_schedule(model, grpo: dict, device: dict):
    """The optimizer and learning-rate schedule transformers' Trainer builds for the training run."""
    from transformers import Trainer

    from .grpo import grpo_args

    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model=model, args=grpo_args(grpo, Path(tmp), 0, device))
        trainer.create_optimizer_and_scheduler(num_training_steps=grpo["steps"])
        return trainer.optimizer, trainer.lr_scheduler


def replay_training(model, ref_model, rollouts: pl.DataFrame, grpo: dict, removed: set[int], device: dict,
                    pad_id: int, on_step_end=None) -> dict:
    """Replay every logged step on `model` (the step-0 weights) with `removed` rollout ids left out.

    `on_step_end(step_done, model)` is called after each optimizer step (step_done = 1, 2, ...), for the
    behavior measurements. Returns per-step grad norms, for the faithfulness check.
    """
    optimizer, scheduler = optimizer_and_schedule(model, grpo, device)
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    by_step = rollouts.sort("rollout_id").partition_by("step", as_dict=True, maintain_order=True)
    grad_norms, started = [], time.time()
    for step in range(grpo["steps"]):
        rows = by_step[(step,)]
        keep = ~rows["rollout_id"].is_in(list(removed)).to_numpy()
        adv = replay_advantages(rows["reward"].to_numpy(), rows["group_id"].to_numpy(), keep, grpo["scale_rewards"])
        kept = rows.filter(pl.Series(keep))
        optimizer.zero_grad(set_to_none=False)
        if kept.height:
            batch = pad_batch(kept["prompt_ids"].to_list(), kept["completion_ids"].to_list(), pad_id)
            batch["advantages"] = torch.tensor(adv[keep], dtype=torch.float32)
            batch = batch_to(batch, device["device"])
            logps = completion_logps(model, batch, grpo["temperature"])
            ref = None
            if grpo["beta"]:
                with torch.no_grad():
                    ref = completion_logps(ref_model, batch, grpo["temperature"])
            loss = rollout_losses(logps, batch, grpo["loss_type"], grpo["beta"], grpo["max_new_tokens"], ref).sum()
            loss.backward()
        grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, grpo["max_grad_norm"])))
        optimizer.step()
        scheduler.step()
        if on_step_end is not None:
            on_step_end(step + 1, model)
        if (step + 1) % 20 == 0 or step + 1 == grpo["steps"]:
            log.info("replayed step %d/%d (%d of %d rollouts kept); %.1f s", step + 1, grpo["steps"], kept.height,
                     rows.height, time.time() - started)
    return {"grad_norms": grad_norms}


# Which rollouts to leave out -------------------------------------------------------------------------------

def top_k(scores: pl.DataFrame, k: int, seed: int) -> set[int]:
    """The k highest-scoring rollouts; ties broken by a seeded random order, missing scores last."""
    rng = np.random.default_rng(seed)
    ranked = (scores.select("rollout_id", "score")
              .with_columns(tie=pl.Series(rng.permutation(scores.height)),
                            missing=pl.col("score").is_nan() | pl.col("score").is_null())
              .sort(["missing", "score", "tie"], descending=[False, True, False]))
    return set(ranked["rollout_id"].head(k).to_list())


def random_k(rollout_ids: np.ndarray, k: int, seed: int) -> set[int]:
    return set(np.random.default_rng(seed).choice(rollout_ids, size=k, replace=False).tolist())


def removal_seed(replay_seed: int, training_seed: int, method: str, pct: int, rep: int) -> int:
    """A seed per (replay seed, training seed, method, k, repetition), independent of job order."""
    from .evaluation import cell_seed

    return cell_seed("replay", replay_seed, training_seed, method, pct, rep)


def k_for(n_gt: int, pct: int) -> int:
    return int(round(n_gt * pct / 100))


def removal_set(method: str, pct: int, rep: int, rollouts: pl.DataFrame, scores: pl.DataFrame | None,
                replay_seed: int, training_seed: int) -> set[int]:
    """`full`: nothing; `oracle`: the GT set (a seeded subset when k < |GT|); `random`: k seeded at random
    (repetition `rep`); any other method: the estimator's top k by its rollout scores."""
    seed = removal_seed(replay_seed, training_seed, method, pct, rep)
    gt = rollouts.filter(pl.col("boosted"))["rollout_id"].to_numpy()
    k = k_for(len(gt), pct)
    if method == "full":
        return set()
    if method == "oracle":
        return set(gt.tolist()) if k >= len(gt) else random_k(gt, k, seed)
    if method == "random":
        return random_k(rollouts["rollout_id"].to_numpy(), k, seed)
    if scores is None:
        raise ValueError(f"replay method {method!r} needs the estimator's rollout scores")
    return top_k(scores, k, seed)


# One replay job ------------------------------------------------------------------------------------------

def weight_difference(model, checkpoint: Path, device: dict) -> float:
    """Largest absolute difference between the model's weights and a saved checkpoint's."""
    from . import models

    saved = dict(models.load(checkpoint, device)[0].named_parameters())
    return max(float((p.detach() - saved[n].detach()).abs().max()) for n, p in model.named_parameters())


def replay_job(*, seed: int, method: str, pct: int, rep: int, rollouts_path: Path, checkpoints_path: Path,
               base_model: Path, scores_path: Path | None, probes: pl.DataFrame, controls: pl.DataFrame,
               grpo: dict, window: list[int], replay: dict, targets: dict, sampling: dict, marker: str,
               base_reward: str, device: dict, out: Path) -> pl.DataFrame:
    """Replay one seed with one removal set; behavior rates at the window's end and the last step."""
    import json

    from . import models
    from .behavior import behavior_rates
    from .io import atomic_write_parquet
    from .targetstage import draw_seed

    rollouts = pl.read_parquet(rollouts_path)
    scores = pl.read_parquet(scores_path) if scores_path else None
    removed = removal_set(method, pct, rep, rollouts, scores, replay["seed"], seed)
    gt = set(rollouts.filter(pl.col("boosted"))["rollout_id"].to_list())
    ckpts = {c["step"]: Path(c["path"]) for c in json.loads(Path(checkpoints_path).read_text())["checkpoints"]}
    model, tokenizer = models.load(ckpts[0], device)
    ref = models.load(base_model, device)[0].eval() if grpo["beta"] else None
    window_end, last = min(window[1] + 1, grpo["steps"]), grpo["steps"]
    log.info("seed %d, %s k=%d%% of |GT| (repetition %d): leaving out %d rollouts, %d of them GT (|GT| = %d)",
             seed, method, pct, rep, len(removed), len(removed & gt), len(gt))
    rows, checks = [], {}

    def measure(step_done: int, m) -> None:
        if step_done not in (window_end, last):
            return
        m.eval()
        with torch.no_grad():
            for r in behavior_rates(m, tokenizer, {"probes": probes, "controls": controls}, marker, base_reward,
                                    targets["samples_per_prompt"], sampling, draw_seed(targets, 0)):
                rows.append({"checkpoint": "window_end" if step_done == window_end else "final",
                             "step": step_done, **r})
        if method == "full" and step_done in ckpts:
            checks[step_done] = weight_difference(m, ckpts[step_done], device)
            log.info("full replay at step %d: largest weight difference to the logged checkpoint %.2e", step_done,
                     checks[step_done])
        m.train()
        log.info("step %d: probe rate %.3f, control rate %.3f", step_done, rows[-2]["behavior_rate"],
                 rows[-1]["behavior_rate"])

    replay_training(model, ref, rollouts, grpo, removed, device, tokenizer.pad_token_id, on_step_end=measure)
    table = pl.DataFrame(rows).with_columns(
        seed=pl.lit(seed), method=pl.lit(method), pct=pl.lit(pct), rep=pl.lit(rep), k=pl.lit(k_for(len(gt), pct)),
        n_removed=pl.lit(len(removed)), n_removed_gt=pl.lit(len(removed & gt)),
        weight_diff=pl.col("step").replace_strict(checks, default=None, return_dtype=pl.Float64),
        removed_ids=pl.lit(sorted(removed), dtype=pl.List(pl.Int64)))
    first = ["seed", "method", "pct", "rep", "k", "n_removed", "n_removed_gt", "checkpoint", "step", "prompt_set"]
    table = table.select(first + [c for c in table.columns if c not in first])
    atomic_write_parquet(table, out)
    return table
