"""Rules replay and replay_table: retrain one seed with a set of rollouts left out (and with the random sets it
is compared with), and tabulate them all.

torch, transformers and the retraining code are imported inside `Replays` only, so the table job
does not spend seconds importing them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from behaviortrace.common.io import atomic_write_parquet
from behaviortrace.common.markdown import write_md_and_html
from behaviortrace.config.sections import Config
from behaviortrace.replay.removal import RANDOM, measured_steps, random_comparisons, removal_set, removal_size
from behaviortrace.replay.table import replay_table, to_markdown
from behaviortrace.train.checkpoints import read_manifest

log = logging.getLogger(__name__)


def replay_job(
    cfg: Config,
    *,
    seed: int,
    removal: str,
    pct: int,
    rollouts_path: Path,
    checkpoints_path: Path,
    base_model: Path,
    scores_path: Path | None,
    probes_path: Path,
    plain_path: Path,
    out: Path,
    semantics: str = "advantages",
) -> pl.DataFrame:
    """Replay one seed with one removal set, then with each of its step-matched random sets (none for `full`);
    behavior rates at `replay.measure_at`, sampled as targets draw 0 samples them. Each replay stops at the
    last step it measures. `semantics` (influence.semantics) says what leaving a rollout out means."""
    rollouts = pl.read_parquet(rollouts_path)
    scores = pl.read_parquet(scores_path) if scores_path else None
    measured = measured_steps(cfg.replay, cfg.planting, cfg.grpo.steps)
    removed = removal_set(removal, pct, rollouts, scores, cfg.replay.seed, seed, max(measured))
    runs = [(removal, None, 0, removed)]
    if removal != "full":
        comparisons = random_comparisons(
            removal, removed, pct, cfg.replay.random_repeats, rollouts, cfg.replay.seed, seed
        )
        runs += [(RANDOM, removal, rep, ids) for rep, ids in enumerate(comparisons)]
    paid = set(rollouts.filter(pl.col("paid"))["rollout_id"].to_list())
    replays = Replays(cfg, rollouts, checkpoints_path, base_model, probes_path, plain_path, measured, semantics)
    tables = []
    for name, matched_to, rep, ids in runs:
        log.info(
            "seed %d, %s removal=%d%% of n_paid%s (repetition %d): leaving out %d rollouts, %d of them paid "
            "(n_paid = %d)",
            seed,
            name,
            pct,
            f", step-matched to {matched_to}" if matched_to else "",
            rep,
            len(ids),
            len(ids & paid),
            len(paid),
        )
        rows, checks, shares = replays.run(ids, check=name == "full")
        tables.append(
            pl.DataFrame(rows).with_columns(
                seed=pl.lit(seed),
                removal=pl.lit(name),
                matched_to=pl.lit(matched_to, dtype=pl.String),
                removal_percent=pl.lit(pct),
                rep=pl.lit(rep),
                removal_size=pl.lit(removal_size(len(paid), pct)),
                n_removed=pl.lit(len(ids)),
                n_removed_paid=pl.lit(len(ids & paid)),
                weight_diff=pl.col("step").replace_strict(checks, default=None, return_dtype=pl.Float64),
                update_error=pl.col("step").replace_strict(shares, default=None, return_dtype=pl.Float64),
                removed_ids=pl.lit(sorted(ids), dtype=pl.List(pl.Int64)),
                semantics=pl.lit(semantics),
            )
        )
    table = pl.concat(tables, how="vertical")
    first = [
        "seed",
        "removal",
        "matched_to",
        "removal_percent",
        "rep",
        "removal_size",
        "n_removed",
        "n_removed_paid",
        "checkpoint",
        "step",
        "prompt_set",
    ]
    table = table.select(first + [c for c in table.columns if c not in first])
    atomic_write_parquet(table, out)
    return table


class Replays:
    """Retrains one seed from its step-0 checkpoint, once per removal set, and measures the behavior rates."""

    def __init__(self, cfg, rollouts, checkpoints_path, base_model, probes_path, plain_path, measured, semantics):
        import torch

        from behaviortrace.common import device as devices
        from behaviortrace.model import models

        self.cfg, self.rollouts, self.measured, self.semantics = cfg, rollouts, measured, semantics
        self.device = devices.resolve(cfg.compute)
        self.prompt_sets = {"probes": pl.read_parquet(probes_path), "plain": pl.read_parquet(plain_path)}
        self.ckpts, _ = read_manifest(checkpoints_path)
        # The step-0 model is loaded once; each replay starts from a copy of its weights put back (loading it again
        # took most of a small replay's time).
        self.model, self.tokenizer = models.load(self.ckpts[0], self.device)
        self.start = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        self.ref = models.load(base_model, self.device)[0].eval() if cfg.grpo.beta else None
        self.torch = torch

    def fresh_model(self):
        """The step-0 model as loaded: its weights put back, no gradients, evaluation mode."""
        self.model.load_state_dict(self.start)
        self.model.zero_grad(set_to_none=True)
        return self.model.eval()

    def run(self, removed: set[int], check: bool) -> tuple[list[dict], dict, dict]:
        """Rows of behavior rates per measured checkpoint; with `check`, each checkpoint's weight difference
        to the logged one and its share of training's update."""
        from behaviortrace.behavior.rates import behavior_rates
        from behaviortrace.common.device import autocast
        from behaviortrace.replay.retrain import replay_training, update_error, weight_difference

        cfg, device, ckpts = self.cfg, self.device, self.ckpts
        grpo, planting = cfg.grpo, cfg.planting
        model = self.fresh_model()
        rows, checks, shares = [], {}, {}

        def measure(step_done: int, m) -> None:
            if step_done not in self.measured:
                return
            m.eval()
            with self.torch.no_grad(), autocast(device):  # sampled in training's precision
                for r in behavior_rates(
                    m,
                    self.tokenizer,
                    self.prompt_sets,
                    planting.marker,
                    cfg.task.base_reward,
                    cfg.targets.samples_per_prompt,
                    grpo.sampling,
                    cfg.targets.draw_seed(0),
                ):
                    rows.append({"checkpoint": self.measured[step_done], "step": step_done, **r})
            if check and step_done in ckpts:
                checks[step_done] = weight_difference(m, ckpts[step_done], device)
                shares[step_done] = update_error(m, ckpts[step_done], ckpts[0], device)
                log.info(
                    "full replay at step %d: largest weight difference to the logged checkpoint %.2e, %.1e of the "
                    "update",
                    step_done,
                    checks[step_done],
                    shares[step_done],
                )
            m.train()
            log.info(
                "step %d: probe rate %.3f, control rate %.3f",
                step_done,
                rows[-2]["behavior_rate"],
                rows[-1]["behavior_rate"],
            )

        replay_training(
            model,
            self.ref,
            self.rollouts,
            grpo,
            removed,
            device,
            self.tokenizer.pad_token_id,
            measure,
            stop_after=max(self.measured),
            semantics=self.semantics,
        )
        return rows, checks, shares


def replay_table_job(*, files: list[Path], out: Path, markdown: Path, html: Path) -> pl.DataFrame:
    """Every replay's rates and their change against the full replay, as Parquet, Markdown and HTML."""
    table = replay_table(files)
    atomic_write_parquet(table, out)
    write_md_and_html(to_markdown(table), markdown, html, "Leave-out replay")
    return table
