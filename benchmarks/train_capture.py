"""What train-time capture (sketch.mode: train) costs: the tiny model's GRPO training with capture, as a ratio
against the same training without it, measured in the same run.

The default config's shapes (256 rollouts per step, k = 4096) over its whole schedule unless `--steps`
shortens it (the plant's window scaled along). The base model is built once (the default config's
pretraining) and every variant trains from it with the same seed, so the variants differ only in the
capture. Each variant runs in-process, one after another, one thread. The
variants take turns for `--repeats` rounds and each ratio is of medians, so that a stretch of a slower
machine (a shared virtual machine drifts by 20% or more over minutes) does not land on one variant alone.

    python benchmarks/train_capture.py                     # 200 steps, 3 rounds; about 11 minutes on 2 cores
    python benchmarks/train_capture.py --steps 20          # about 2 minutes; per-run costs weigh more
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

from behaviortrace.common.device import resolve  # noqa: E402
from behaviortrace.config.load import defaults  # noqa: E402
from behaviortrace.config.sections import Compute, Config  # noqa: E402
from behaviortrace.model import models  # noqa: E402
from behaviortrace.plant.prompts import plant_prompts  # noqa: E402
from behaviortrace.preflight.base_model import build_base_model  # noqa: E402
from behaviortrace.sketch.capture import capture_factory  # noqa: E402
from behaviortrace.train import grpo  # noqa: E402


def short_config(steps: int) -> dict:
    raw = defaults()
    # The default plant's window, scaled to the shortened schedule (the default config's own at full length),
    # so that the share of steps with the marker in play matches the default run's.
    full = raw["grpo"]["steps"]
    raw["planting"]["window"] = [min(steps - 1, w * steps // full) for w in raw["planting"]["window"]]
    raw["grpo"].update(steps=steps, save_every=steps)
    return raw


def train_once(raw: dict, base: Path, prompts, out: Path, device: dict, capture: bool) -> tuple[float, float]:
    """Wall-clock and CPU seconds (this process, every thread) of one training run."""
    cfg = Config.from_dict(raw)
    model, tokenizer = models.load(base, device)
    factory = capture_factory(cfg, model, tokenizer, base, device, out / "capture", "bench") if capture else None
    started, cpu = time.perf_counter(), time.process_time()
    grpo.train(model, tokenizer, prompts, cfg, 0, out, device, "bench", capture_factory=factory)
    return time.perf_counter() - started, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the config's grpo.steps)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = resolve(Compute(device="cpu", dtype="float32"))
    raw = short_config(args.steps or defaults()["grpo"]["steps"])
    cfg = Config.from_dict(raw)
    variants = {"training without capture": (raw, False)}
    for method in ("countsketch", "factored"):
        variant = copy.deepcopy(raw)
        variant["sketch"].update(mode="train", method=method)
        variants[f"training with capture, {method}"] = (variant, True)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model, tokenizer = build_base_model(cfg, device)
        models.save(model, tokenizer, tmp / "base")
        prompts = plant_prompts(cfg.task, cfg.planting, cfg.grpo, cfg.probes, cfg.probes.seed)["train"]
        for round_ in range(args.repeats):
            for i, (name, (variant, capture)) in enumerate(variants.items()):
                out = tmp / f"round{round_}-{i}"
                times[name].append(train_once(variant, tmp / "base", prompts, out, device, capture=capture))
    print(f"{cfg.grpo.steps} steps of {cfg.grpo.batch_size} rollouts, k = {cfg.sketch.k}, {args.repeats} rounds")
    base_wall, base_cpu = (statistics.median(t[i] for t in times["training without capture"]) for i in (0, 1))
    for name, took in times.items():
        wall, cpu = (statistics.median(t[i] for t in took) for i in (0, 1))
        runs = " ".join(f"{t[0]:.1f}" for t in took)
        if name == "training without capture":
            ratio = "(baseline)"
        else:
            ratio = f"with/without {wall / base_wall:5.2f}x (CPU time {cpu / base_cpu:5.2f}x)"
        print(f"{name:<34} median {wall:6.1f} s   {ratio}   runs: {runs}")


if __name__ == "__main__":
    main()
