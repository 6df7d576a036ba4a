"""Retraining one seed from its step-0 checkpoint once per removal set, and measuring the behavior rates after
each (rule replay). torch, transformers and the retraining code are imported when a `Replays` is made, so the
table job does not spend seconds importing them."""

from __future__ import annotations

import logging

import polars as pl

from behaviortrace.train.checkpoints import read_manifest

log = logging.getLogger(__name__)


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
