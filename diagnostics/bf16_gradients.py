"""bfloat16 against float32: how close train-time capture comes with `compute.dtype: bfloat16`, measured on the CPU.

`compute.dtype: bfloat16` is mixed precision (common/device.py): float32 weights, forward and backward passes under
bf16 autocast. For each model family (the built-in tiny model and small real architectures, model/families.py),
three GRPO steps of the tests' small config (no KL term, as in the paper's setting) are trained twice from the same
base model, once with `compute.dtype: bfloat16` and once in float32, with train-time capture on (the bf16
self-check is not enforced here: it is what is measured). Per family it prints:

- self-check: the largest relative error of a step's summed rollout sketches against the sketch of the gradient
  TRL applied (bf16 and float32 runs);
- capture vs autograd: per rollout, the captured sketch against the sketch of the rollout's own autograd gradient
  at the step's weights, in the same precision (largest relative error over the rollouts of every step);
- bf16 vs float32: the bf16 capture against each rollout's float32 autograd gradient (no autocast) at the same
  weights: how far a bf16 sketch is from an exact one.

The self-check tolerance for bf16 (sketch/tolerance.py) is four times the largest bf16 self-check error printed
here; tests/test_model_families.py bounds a bf16 rollout's error by four times the largest capture vs autograd and
bf16 vs float32 errors printed here (kept in sketch/tolerance.py).

With `--updates`, it also trains a 256-wide, 2-layer Qwen2 (tied embeddings) ten GRPO steps at the paper's
learning rate 5e-6 in float32, in mixed precision and with pure bf16 weights (the model cast to bf16, as
`compute.dtype: bfloat16` trained before it meant mixed precision), and prints the share of parameters the ten
AdamW updates left unchanged and the size of the update relative to the weights
(tests/test_mixed_precision.py checks the same at a smaller width).

    python diagnostics/bf16_gradients.py [--families tiny qwen2_tied ...] [--updates]   # about a minute per family
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
ROOT = Path(__file__).resolve().parents[1]

import torch  # noqa: E402

from behaviortrace.common.device import resolve  # noqa: E402
from behaviortrace.config.sections import Compute, Config  # noqa: E402
from behaviortrace.model import families, models  # noqa: E402
from behaviortrace.plant.prompts import plant_prompts  # noqa: E402
from behaviortrace.preflight.base_model import build_base_model  # noqa: E402
from behaviortrace.sketch import capture, tolerance  # noqa: E402
from behaviortrace.sketch.sketcher import step_sum_error  # noqa: E402
from behaviortrace.sketch.store import read_rows, read_steps  # noqa: E402
from behaviortrace.tools.grpo_checks import WeightSpy, autograd_sketches, run_training, sketch_errors, update_sizes  # noqa: E402
from behaviortrace.tools.small_runs import small_config  # noqa: E402

STEPS = 3


def family_config(name: str, folder: Path) -> dict:
    """The tests' small config, without the KL term as in the paper's bf16 setting (with it, the rollouts of
    advantage 0 carry only its tiny gradient, whose error relative to itself says nothing about attribution)."""
    cfg = small_config()
    cfg["grpo"].update(steps=STEPS, save_every=STEPS, beta=0.0)
    cfg["planting"]["window"] = [0, STEPS - 1]
    if name != "tiny":
        families.save_family(name, folder / "source", cfg["planting"]["trigger"], cfg["planting"]["marker"])
        cfg["model"]["name"] = str(folder / "source")
    return cfg


def measure(name: str, folder: Path) -> dict:
    cfg = family_config(name, folder)
    fp32 = resolve(Compute(device="cpu", dtype="float32"))
    bf16 = resolve(Compute(device="cpu", dtype="bfloat16"))
    config = Config.from_dict(cfg)
    model, tokenizer = build_base_model(config, fp32)
    models.save(model, tokenizer, folder / "base")
    prompts = plant_prompts(config.task, config.planting, config.grpo, config.probes, config.probes.seed)["train"]
    out = {}
    for label, device in (("float32", fp32), ("bfloat16", bf16)):
        run = folder / label
        _, info = run_training(cfg, folder / "base", prompts, 0, run, device, capture=True, trainer_cls=WeightSpy)
        stores = sorted((run / "train" / "capture").glob("shard*.zarr"))
        out[f"self_check_{label}"] = float(read_steps(stores)["self_check_error"].max())
        weights = info["trainer"].step_weights
        same, exact = [], []
        for step in range(STEPS):
            want, _, stored, _ = autograd_sketches(run, stores, weights[step], step, folder / "base", cfg, device)
            same.append(sketch_errors(want, stored["sketch"]).max())
            if label == "bfloat16":  # the same (float32) weights, the rollouts' gradients without autocast
                assert all(w.dtype == torch.float32 for w in weights[step].values())
                want32, _, _, _ = autograd_sketches(run, stores, weights[step], step, folder / "base", cfg, fp32)
                exact.append(sketch_errors(want32, stored["sketch"]).max())
        out[f"capture_vs_autograd_{label}"] = float(max(same))
        if exact:
            out["bf16_vs_float32"] = float(max(exact))
        assert read_rows(stores, with_sketches=False)[1]["mode"] == "train"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="*", default=["tiny", "qwen2_tied", "llama", "gpt2", "opt", "gemma2"])
    parser.add_argument("--updates", action="store_true", help="also measure the updates at lr 5e-6 (see above)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # Measured here, not enforced: the step-sum error of every step, against the step gradient or, where the
    # rollouts cancel, float32's tolerance (1e-3) times their summed norms (a lower floor than bf16's: larger errors).
    capture.check_step_sum = lambda sketches, reference, against, tol: step_sum_error(
        sketches, reference, tolerance.tolerance_for("float32")
    )
    rows = []
    if args.updates:
        with tempfile.TemporaryDirectory() as tmp:
            sizes = update_sizes(small_config(), Path(tmp), hidden=256)
        print("\n| training | unchanged share | relative update |\n|---|---|---|")
        for label, size in sizes.items():
            print(f"| {label} | {size['unchanged']:.2e} | {size['relative_update']:.2e} |", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.families:
            rows.append((name, measure(name, Path(tmp) / name)))
            print(name, rows[-1][1], flush=True)
    keys = [
        "self_check_float32",
        "self_check_bfloat16",
        "capture_vs_autograd_float32",
        "capture_vs_autograd_bfloat16",
        "bf16_vs_float32",
    ]
    print("\n| family | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, values in rows:
        print(f"| {name} | " + " | ".join(f"{values[k]:.1e}" for k in keys) + " |")
    checks = max(v["self_check_bfloat16"] for _, v in rows)
    per_rollout = max(v["capture_vs_autograd_bfloat16"] for _, v in rows)
    print(f"\nlargest bf16 self-check error: {checks:.2e} (tolerance, 4x: {4 * checks:.1e})")
    print(f"largest bf16 capture vs autograd error, per rollout: {per_rollout:.2e} (4x: {4 * per_rollout:.1e})")
    print(f"largest bf16 vs float32 error, per rollout: {max(v['bf16_vs_float32'] for _, v in rows):.2e}")
    print(
        f"(sketch/tolerance.py has {tolerance.BF16_SELF_CHECK_MEASURED:.1e}, {tolerance.BF16_ROLLOUT_MEASURED:.1e} and "
        f"{tolerance.BF16_VS_FLOAT32_MEASURED:.1e})"
    )


if __name__ == "__main__":
    main()
