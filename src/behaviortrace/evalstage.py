"""The score and evaluate stages: wiring files to estimators and metrics for one seed and draw."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import polars as pl

from . import estimators
from .estimators import target_cosine
from .evaluation import evaluate, with_ground_truth
from .io import atomic_write_parquet
from .scoring import run_estimator
from .seedview import SeedView, Target

log = logging.getLogger(__name__)
TARGET_KINDS = ("in_context", "forced")


def score_job(*, estimator: str, params: dict, target: str, draw: int, shards: list[Path], rollouts: Path,
              target_store: Path | None, out_rollouts: Path, out_steps: Path) -> None:
    view = SeedView(shards, rollouts)
    tgt = Target.load(target_store, target, draw) if target != "none" else None
    roll, steps = run_estimator(estimator, params, view, tgt)
    atomic_write_parquet(roll, out_rollouts)
    atomic_write_parquet(steps, out_steps)


def score_keys(config: dict) -> list[tuple[str, str]]:
    """(estimator, target) pairs: each target kind for estimators that use one, 'none' for controls."""
    keys = []
    for name in config["estimators"]:
        uses = estimators.load(name).USES_TARGET
        keys += [(name, t) for t in config["evaluation"]["targets"]] if uses else [(name, "none")]
    return keys


def probe_rate_per_row(view: SeedView, rates: pl.DataFrame) -> np.ndarray:
    """This draw's probe behavior rate at the analysis checkpoint that stands for each row's checkpoint."""
    probes = rates.filter(pl.col("prompt_set") == "probes").sort("step")
    steps = probes["step"].to_numpy()
    idx = np.searchsorted(steps, view.rollouts["checkpoint_step"].to_numpy(), side="right") - 1
    return probes["behavior_rate"].to_numpy()[idx]


def token_inputs(view: SeedView, target_store: Path, draw: int) -> dict:
    return token_cosines(view, {kind: Target.load(target_store, kind, draw) for kind in TARGET_KINDS})


def token_cosines(view: SeedView, targets: dict[str, Target]) -> dict:
    """Per target kind: cosines of behavior-token and of null-position sketches with the target.

    The sketches are loss gradients, -advantage x the log-prob gradient (plus the KL term), so each
    cosine is multiplied by the sign of the advantage: it then compares the direction in which the
    rollout's marker tokens (or null positions) were made more likely with the target. Rollouts with
    zero advantage carry no such direction and are left out.
    """
    has_marker, null_norm = view.array("has_marker"), view.array("null_norm")
    sign = np.sign(view.rollouts["advantage"].to_numpy())
    out = {}
    for kind, target in targets.items():
        idx, has = target.for_rows(view)
        usable = has & (sign != 0)
        # Minus the loss gradient's cosine: the direction the tokens were made more likely.
        behavior = np.where(usable & has_marker, -sign * target_cosine(view.array("behavior_sketch"), target, idx),
                            np.nan)
        null = np.where(usable & (null_norm > 0), -sign * target_cosine(view.array("null_sketch"), target, idx),
                        np.nan)
        out[kind] = (behavior, null)
    return out


def evaluate_job(*, run: str, seed: int, draw: int, shards: list[Path], rollouts: Path, target_store: Path,
                 rates: Path, score_files: dict[tuple[str, str], tuple[Path, Path]], window: list[int],
                 saturation: float, evaluation: dict, out: Path, placebo: bool = False) -> None:
    view = SeedView(shards, rollouts)
    scores = {key: (pl.read_parquet(r), pl.read_parquet(s)) for key, (r, s) in score_files.items()}
    labelled = with_ground_truth(view.rollouts, placebo)
    log.info("seed %d draw %d: %d rollouts, %d in the ground truth (%s), %d score sets", seed, draw,
             labelled.height, int(labelled["label"].sum()), "eligible with the behavior, placebo" if placebo
             else "boosted", len(scores))
    table = evaluate(run=run, seed=seed, draw=draw, rollouts=labelled, fluency=view.fluency,
                     probe_rate=probe_rate_per_row(view, pl.read_parquet(rates)), scores=scores, window=window,
                     saturation=saturation, n_boot=evaluation["bootstrap"], eval_seed=evaluation["seed"],
                     fluency_match=evaluation["fluency_match"], min_matched_pairs=evaluation["min_matched_pairs"],
                     token=token_inputs(view, target_store, draw))
    atomic_write_parquet(table, out)
    log.info("%d metric rows written to %s", table.height, out)
