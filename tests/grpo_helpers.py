"""Run real GRPO training from tests, in-process or in a child process, and check what train-time capture stored
against each rollout's own autograd gradient at its step's weights (also used by diagnostics/bf16_gradients.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import torch

from behaviortrace.config.sections import Config
from behaviortrace.gradients.batch import completion_logps, rows_of, step_batch
from behaviortrace.model import models
from behaviortrace.sketch.maps import SketchMap
from behaviortrace.sketch.store import read_rows
from behaviortrace.train import grpo
from behaviortrace.train.stage import capture_factory, finalize
from behaviortrace.train.trl_surface import rollout_losses


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


class WeightSpy(grpo.RolloutLoggingGRPOTrainer):
    """Copies the weights of every step (the ones its gradient is taken at) before capture and clipping."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_weights: dict[int, dict[str, torch.Tensor]] = {}

    def before_clip(self):
        self.step_weights[self.state.global_step] = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        super().before_clip()


def own_gradients(model, ref_model, batch: dict, grpo, num_items: int) -> list[dict[str, torch.Tensor]]:
    """Each rollout's gradient by its own backward pass (KL term against the base model included)."""
    out = []
    for i in range(batch["advantages"].shape[0]):
        row = rows_of(batch, i, i + 1)
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            ref = completion_logps(ref_model, row, grpo.temperature)
        loss = rollout_losses(
            completion_logps(model, row, grpo.temperature),
            row,
            grpo.loss_type,
            grpo.beta,
            grpo.max_new_tokens,
            ref,
            num_items=num_items,
            n_rows=batch["advantages"].shape[0],
        ).sum()
        loss.backward()
        out.append(
            {
                n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
                for n, p in model.named_parameters()
            }
        )
    model.zero_grad(set_to_none=True)
    return out


def autograd_sketches(
    run_dir: Path, stores: list[Path], weights: dict, step: int, base_model_dir, cfg, device, ref_device=None
):
    """For every rollout of `step`: the sketch and exact norm of its own autograd gradient over every trainable
    parameter, at the step's `weights` (a WeightSpy copy), in `device`'s dtype; beside what capture stored for it.
    The KL term's reference model is the base model as `ref_device` loads it (default `device`: the run's own).
    Returns (wanted sketches [n, k], wanted norms [n], stored rows of the step, the step's logged rollouts)."""
    config = Config.from_dict(cfg)
    model, tokenizer = models.load(base_model_dir, device)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    shared = {p.data_ptr() for p in model.parameters()}  # a tied head is no parameter of its own
    assert not unexpected and all(model.state_dict()[k].data_ptr() in shared for k in missing), (missing, unexpected)
    ref_model = models.load(base_model_dir, ref_device or device)[0].to(device["torch_dtype"]).eval()
    rows = pl.read_parquet(Path(run_dir) / "rollouts.parquet").filter(pl.col("step") == step).sort("rollout_id")
    steps = pl.read_parquet(Path(run_dir) / "steps.parquet")
    num_items = int(steps.filter(pl.col("step") == step)["num_items_in_batch"][0])
    grads = own_gradients(model, ref_model, step_batch(rows, tokenizer.pad_token_id), config.grpo, num_items)
    smap = SketchMap.for_model(model, config.sketch.method, config.sketch.k, config.sketch.seed)
    wanted, norms = [], []
    for g in grads:
        trainable = {n: g[n] for n in smap.layout}  # every trainable parameter
        sketch, _ = smap.sketch_dense(trainable)
        wanted.append(sketch.double().numpy().ravel())
        norms.append(float(sum(t.double().pow(2).sum() for t in trainable.values())) ** 0.5)
    stored, _ = read_rows(stores)
    at = np.flatnonzero(stored["step"] == step)
    assert np.array_equal(stored["rollout_id"][at], rows["rollout_id"].to_numpy())
    return np.array(wanted), np.array(norms), {name: values[at] for name, values in stored.items()}, rows


def sketch_errors(wanted: np.ndarray, stored: np.ndarray) -> np.ndarray:
    """Per rollout: ||stored - wanted|| / ||wanted|| (the absolute error where the rollout's gradient is zero)."""
    diff = np.linalg.norm(stored - wanted, axis=1)
    scale = np.linalg.norm(wanted, axis=1)
    return np.where(scale > 0, diff / np.maximum(scale, 1e-300), diff)


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
