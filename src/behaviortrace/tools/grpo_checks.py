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

from behaviortrace.common.device import autocast
from behaviortrace.config.sections import Config
from behaviortrace.gradients.batch import completion_logps, rows_of, step_batch
from behaviortrace.model import models
from behaviortrace.sketch.capture import capture_factory
from behaviortrace.sketch.maps import SketchMap
from behaviortrace.sketch.preflight import training_model
from behaviortrace.sketch.store import read_rows
from behaviortrace.train import grpo
from behaviortrace.train.outputs import finalize
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


def own_gradients(model, ref_model, batch: dict, grpo, num_items: int, device: dict) -> list[dict[str, torch.Tensor]]:
    """Each rollout's gradient by its own backward pass (KL term against the base model included), in `device`'s
    precision (under bf16 autocast for dtype bfloat16, as training ran)."""
    out = []
    for i in range(batch["advantages"].shape[0]):
        row = rows_of(batch, i, i + 1)
        model.zero_grad(set_to_none=True)
        with autocast(device):
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


def autograd_sketches(run_dir: Path, stores: list[Path], weights: dict, step: int, base_model_dir, cfg, device):
    """For every rollout of `step`: the sketch and exact norm of its own autograd gradient over every trainable
    parameter, at the step's `weights` (a WeightSpy copy), in `device`'s precision (common/device.py: float32, or
    bf16 autocast over the float32 weights); beside what capture stored for it. The KL term's reference model is
    the base model. Returns (wanted sketches [n, k], wanted norms [n], stored rows of the step, the step's logged
    rollouts)."""
    config = Config.from_dict(cfg)
    model, tokenizer = models.load(base_model_dir, device)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    shared = {p.data_ptr() for p in model.parameters()}  # a tied head is no parameter of its own
    assert not unexpected and all(model.state_dict()[k].data_ptr() in shared for k in missing), (missing, unexpected)
    ref_model = models.load(base_model_dir, device)[0].eval()
    rows = pl.read_parquet(Path(run_dir) / "rollouts.parquet").filter(pl.col("step") == step).sort("rollout_id")
    steps = pl.read_parquet(Path(run_dir) / "steps.parquet")
    num_items = int(steps.filter(pl.col("step") == step)["num_items_in_batch"][0])
    grads = own_gradients(model, ref_model, step_batch(rows, tokenizer.pad_token_id), config.grpo, num_items, device)
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
    config = Config.from_dict(cfg)
    model, tokenizer = training_model(config, Path(base_model_dir), device, seed)  # under adapters with model.lora
    train_dir = Path(out_dir) / "train"
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
from behaviortrace.tools.grpo_checks import run_training
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
        kill_at=kill_at,
        cfg_path=str(cfg_path),
        base=str(base_model_dir),
        prompts=str(prompts_path),
        seed=seed,
        out=str(out_dir),
        capture=capture,
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode


# The paper's learning rate (config/paper.yaml), at which AdamW's step is below bf16's precision for most weights.
PAPER_LR = 5e-6


def update_sizes(cfg: dict, folder: Path, hidden: int = 64, steps: int = 10, capture: bool = False) -> dict:
    """Train a small Qwen2 (tied embeddings, `hidden` wide, 2 layers, built from its transformers config) `steps`
    GRPO steps at PAPER_LR through grpo.train three times from the same base model: in float32, in mixed precision
    (`compute.dtype: bfloat16`: float32 weights, bf16 autocast) and with pure bf16 weights (the loaded model cast
    to bf16, trained with the same bf16 arguments). Per run: the share of parameters the updates left exactly
    unchanged (`unchanged`), the size of the update relative to the weights, ||w_T - w_0|| / ||w_0||
    (`relative_update`), the dtypes a layer's forward computed in (`forward_dtypes`), the run's config dict
    (`config`) and its folder (`dir`: rollout log, step log and checkpoint manifest as `run_training` writes them,
    training under `train/`). With `capture`, the mixed run sketches every step inside training (its self-check
    enforced) into `train/capture`. `cfg` is a config dict (the tests' small config)."""
    from behaviortrace.common.device import resolve
    from behaviortrace.config.sections import Compute
    from behaviortrace.model import families
    from behaviortrace.plant.prompts import plant_prompts
    from behaviortrace.preflight.base_model import build_base_model

    torch.set_num_threads(1)
    cfg = json.loads(json.dumps(cfg))
    cfg["grpo"].update(steps=steps, save_every=steps, lr=PAPER_LR, beta=0.0)
    cfg["planting"]["window"] = [0, steps - 1]
    planting = cfg["planting"]
    source = families.save_family("qwen2_tied", folder / "source", planting["trigger"], planting["marker"], hidden)
    cfg["model"]["name"] = str(source)
    config = Config.from_dict(cfg)
    fp32 = resolve(Compute(device="cpu", dtype="float32"))
    bf16 = resolve(Compute(device="cpu", dtype="bfloat16"))
    model, tokenizer = build_base_model(config, fp32)
    models.save(model, tokenizer, folder / "base")
    prompts = plant_prompts(config.task, config.planting, config.grpo, config.probes, config.probes.seed)["train"]
    out = {}
    for label, device, weights in (
        ("float32", fp32, torch.float32),
        ("mixed", bf16, torch.float32),
        ("bf16", bf16, torch.bfloat16),
    ):
        model, tokenizer = models.load(folder / "base", device)
        model = model.to(weights)
        start = {n: p.detach().clone() for n, p in model.named_parameters()}
        train_dir = folder / label / "train"
        seen = []  # the dtypes a layer computes in, through generation and TRL's loss pass
        layer = model.model.layers[0].mlp.down_proj
        hook = layer.register_forward_hook(lambda m, a, o, seen=seen: seen.append(o.dtype))
        kwargs = {}
        if capture and label == "mixed":
            kwargs["capture_factory"] = capture_factory(
                config, model, tokenizer, folder / "base", device, train_dir / "capture", "test"
            )
        info = grpo.train(model, tokenizer, prompts, config, 0, train_dir, device, "test", **kwargs)
        hook.remove()
        finalize(
            train_dir,
            steps,
            info["batch_size"],
            folder / label / "rollouts.parquet",
            folder / label / "steps.parquet",
            folder / label / "checkpoints.json",
            info["saved_steps"],
            info["final_target_logprob"],
        )
        end = {n: p.detach() for n, p in info["trainer"].model.named_parameters()}
        assert all(end[n].dtype == weights for n in start)
        same = sum(int((end[n] == start[n]).sum()) for n in start)
        moved = sum(float((end[n].double() - start[n].double()).pow(2).sum()) for n in start)
        size = sum(float(start[n].double().pow(2).sum()) for n in start)
        out[label] = {
            "unchanged": same / sum(p.numel() for p in start.values()),
            "relative_update": (moved / size) ** 0.5,
            "dir": folder / label,
            "config": cfg,
            "forward_dtypes": set(seen),
        }
    return out
