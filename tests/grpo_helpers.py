"""Run real GRPO training on the tiny model from tests, in-process or in a child process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from behaviortrace.config.sections import Config
from behaviortrace.model import models
from behaviortrace.train import grpo
from behaviortrace.train.stage import capture_factory, finalize


class GradSpy(grpo.RolloutLoggingGRPOTrainer):
    """Copies the accumulated gradient of each step just before TRL clips it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_grads: dict[int, torch.Tensor] = {}

    def _clip_grad_norm(self, model):
        self.step_grads[self.state.global_step] = torch.cat(
            [p.grad.detach().flatten().clone() for p in model.parameters() if p.requires_grad]
        )
        return super()._clip_grad_norm(model)


def run_training(cfg, base_model_dir, train_prompts, seed, out_dir, device, capture=False, **kwargs):
    """Train (with `capture`: also sketch every step inside training, into train/capture/; with a `probes`
    keyword, the probe prompts: also measure the forced target at every step)."""
    torch.set_num_threads(1)
    model, tokenizer = models.load(base_model_dir, device)
    train_dir = Path(out_dir) / "train"
    config = Config.from_dict(cfg)
    if capture:
        kwargs["capture_factory"] = capture_factory(
            config, model, tokenizer, Path(base_model_dir), device, train_dir / "capture", "test"
        )
    info = grpo.train(model, tokenizer, train_prompts, config, seed, train_dir, device, "test", **kwargs)
    rollouts = finalize(
        train_dir,
        cfg["grpo"]["steps"],
        info["batch_size"],
        Path(out_dir) / "rollouts.parquet",
        Path(out_dir) / "steps.parquet",
        Path(out_dir) / "checkpoints.json",
        info["saved_steps"],
        info["final_target_logprob"],
    )
    return rollouts, info


CHILD = """
import json, os, signal, sys
from pathlib import Path
import polars as pl
from transformers import TrainerCallback
sys.path.insert(0, {tests!r})
from grpo_helpers import run_training
from behaviortrace.common.device import resolve
from behaviortrace.config.sections import Compute

class KillAt(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        if state.global_step == {kill_at}:
            os.kill(os.getpid(), signal.SIGKILL)

cfg = json.loads(Path({cfg_path!r}).read_text())
run_training(cfg, Path({base!r}), pl.read_parquet({prompts!r}), {seed}, Path({out!r}),
             resolve(Compute(device="cpu", dtype="float32")), capture={capture}, callbacks=(KillAt(),))
"""


def train_and_sigkill(cfg, base_model_dir, prompts_path, seed, out_dir, kill_at: int, capture=False) -> int:
    """Train in a child process that SIGKILLs itself right after optimizer step `kill_at`."""
    cfg_path = Path(out_dir) / "cfg.json"
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(json.dumps(cfg))
    code = CHILD.format(
        tests=str(Path(__file__).parent),
        kill_at=kill_at,
        cfg_path=str(cfg_path),
        base=str(base_model_dir),
        prompts=str(prompts_path),
        seed=seed,
        out=str(out_dir),
        capture=capture,
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode
