"""How the cost of train-time capture grows with the model: GRPO steps with capture (countsketch and factored)
against the same steps without it, in the same run, for Qwen2 models (tied embeddings and a chat template, the
paper's architecture family, model/families.py) of four sizes spanning more than 100x in parameters (width and
depth both grow), at the paper's step shape: 16 rollouts of up to 64 new tokens, k = 65,536.

Every variant trains in a child process of its own, one thread, from the same base model and seed, so the
variants differ only in the capture. Per variant: the median time of a step (the first step left out; on the CPU
the child's CPU time, which other processes on a shared machine do not inflate; on CUDA wall time) and the peak
memory the training added (on the CPU: the child's peak resident set size minus its size before training; on
CUDA: the peak allocated). Printed per size as it is measured: parameters, tokens per step, the time and memory of
each variant, and captured / uncaptured as ratios.

Then an extrapolation to the paper's setting (Qwen2.5-1.5B, the same step shape with about 48 prompt tokens), from
linear fits over the sizes (least squares), each cost against the quantity that drives it:
  - the uncaptured step: seconds = g * (tokens x parameters) + h (a forward and backward pass per token);
  - countsketch's extra seconds = a * (tokens x matrix parameters) + b: it builds each rollout's gradient of every
    weight matrix from its factors (a product over the rollout's tokens), block by block, and scatters it into the
    k buckets (that part grows with rollouts x parameters, a fixed share of tokens x parameters here);
  - factored's extra seconds = a * (tokens x kept width x d) + b: it projects the kept factors to d x d blocks;
  - either's extra memory = c * (tokens x kept width) + e, the kept width being what capture holds per token until
    the step is sketched: for each weight matrix its input and output widths (for the embedding and the head, the
    hidden width: token ids and the head's logits gradient are not kept per step). Countsketch's cache of bucket
    hashes (12 bytes per parameter, at most 1.5 GiB: sketch/maps.py) is taken out before the fit and added back.
The paper model's shapes come from its transformers config, instantiated on the meta device (nothing is
downloaded or allocated). The fits hold for this device; a GPU changes the constants (matrix products gain more
than scatters), so the ratio predicted here is this device's: diagnostics/gpu_check.sh measures it on a GPU.

    python benchmarks/capture_scaling.py             # about 10 minutes on 2 shared CPU cores
    python benchmarks/capture_scaling.py --quick     # the two smallest sizes, 3 steps: about 2 minutes
    python benchmarks/capture_scaling.py --device cuda --sizes 256x4 512x8 1024x12 1536x16
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
ROOT = Path(__file__).resolve().parents[1]

import numpy as np  # noqa: E402

from behaviortrace.config.load import defaults  # noqa: E402
from behaviortrace.tools.workflows import PAPER_MODEL  # noqa: E402

DEFAULT_SIZES = ("64x1", "128x2", "256x4", "512x6")  # hidden width x layers
VARIANTS = ("none", "countsketch", "factored")
# 4 prompts x 4 generations; 64 new tokens and about 48 prompt tokens (the chat template's and the task's)
PAPER_ROLLOUTS, PAPER_TOKENS = 16, 16 * (64 + 48)
# Countsketch keeps the bucket and sign of each coordinate it hashed (int64 + float32), up to a cap (sketch/maps.py).
HASH_CACHE_BYTES, HASH_CACHE_COORDS = 12, 2**27


def run_config(steps: int, variant: str, model_dir: Path, device: str, k: int) -> dict:
    raw = defaults()
    raw["compute"]["device"] = device
    raw["model"]["name"] = str(model_dir)
    raw["grpo"].update(steps=steps, save_every=steps, prompts_per_step=4, num_generations=4, max_new_tokens=64)
    raw["planting"]["window"] = [0, steps - 1]
    raw["sketch"].update(mode="train", method=variant if variant != "none" else "countsketch", k=k)
    raw["sketch"]["chunk_rollouts"] = 16
    return raw


def kept_width(model) -> int:
    """Floats capture keeps per token until the step is sketched: each weight matrix's input and output widths; for
    the embedding (ids) and the head (its logits gradient is rebuilt per chunk of rollouts), the hidden width."""
    from behaviortrace.gradients.per_example import param_layout

    edges = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    names = {n: id(p) for n, p in model.named_parameters()}
    width = 0
    for name, (kind, shape) in param_layout(model).items():
        if kind == "matrix":
            width += shape[1] * (1 + model.config.tie_word_embeddings) if names[name] in edges else shape[0] + shape[1]
    return width


def matrix_params(model) -> int:
    from behaviortrace.gradients.per_example import param_layout

    return sum(shape[0] * shape[1] for kind, shape in param_layout(model).values() if kind == "matrix")


def factored_dim(model, k: int) -> int:
    """The side d of each weight matrix's d x d block in the factored map of width k."""
    from behaviortrace.gradients.per_example import param_layout
    from behaviortrace.sketch.maps import SketchMap

    return SketchMap(param_layout(model), "factored", k, 0).dim


def child(args) -> None:
    """One variant's training; prints one JSON line."""
    import torch
    from transformers import TrainerCallback

    from behaviortrace.common.device import resolve
    from behaviortrace.config.sections import Config
    from behaviortrace.model import models
    from behaviortrace.plant.prompts import plant_prompts
    from behaviortrace.sketch.capture import capture_factory
    from behaviortrace.train import grpo

    torch.set_num_threads(1)
    raw = run_config(args.steps, args.variant, Path(args.model), args.device, args.k)
    cfg = Config.from_dict(raw)
    device = resolve(cfg.compute)
    base = Path(args.work) / "base"
    model, tokenizer = models.load(base, device)
    prompts = plant_prompts(cfg.task, cfg.planting, cfg.grpo, cfg.probes, cfg.probes.seed)["train"]
    out = Path(args.work) / args.variant
    factory = None
    if args.variant != "none":
        factory = capture_factory(cfg, model, tokenizer, base, device, out / "capture", "bench")

    class StepTimes(TrainerCallback):
        """Per step: wall seconds (after the GPU finished), and this process's CPU seconds (one thread: on a shared
        CPU, the time other processes take does not count)."""

        def __init__(self):
            self.times, self.cpu, self.started = [], [], None

        def on_step_begin(self, *a, **kw):
            if device["use_cuda"]:
                torch.cuda.synchronize()
            self.started = (time.perf_counter(), time.process_time())

        def on_step_end(self, *a, **kw):
            if device["use_cuda"]:
                torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self.started[0])
            self.cpu.append(time.process_time() - self.started[1])

    timer = StepTimes()
    if device["use_cuda"]:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _rss_bytes()
    grpo.train(model, tokenizer, prompts, cfg, 0, out, device, "bench", capture_factory=factory, callbacks=(timer,))
    peak = (
        torch.cuda.max_memory_allocated()
        if device["use_cuda"]
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    print(
        json.dumps(
            {
                # On a GPU the step's wall time; on a CPU its CPU time.
                "step_s": statistics.median(timer.times[1:] if device["use_cuda"] else timer.cpu[1:]),
                "wall_s": statistics.median(timer.times[1:]),
                "extra_mb": (peak - before) / 2**20,
                "params": sum(p.numel() for p in model.parameters()),
                "matrix_params": matrix_params(model),
                "kept_width": kept_width(model),
                "factored_dim": factored_dim(model, args.k),
                "rollouts": cfg.grpo.batch_size,
            }
        )
    )


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(size: str, steps: int, device: str, k: int, work: Path) -> dict:
    """Build the size's model and base model once; train each variant in a child process."""
    from behaviortrace.common.device import resolve
    from behaviortrace.config.sections import Config
    from behaviortrace.model import families, models
    from behaviortrace.preflight.base_model import build_base_model

    hidden, layers = (int(x) for x in size.split("x"))
    raw = run_config(steps, "none", work / "source", device, k)
    families.save_family(
        "qwen2_tied", work / "source", raw["planting"]["trigger"], raw["planting"]["marker"], hidden, layers
    )
    cfg = Config.from_dict(raw)
    model, tokenizer = build_base_model(cfg, resolve(cfg.compute))
    models.save(model, tokenizer, work / "base")
    rows = {}
    for variant in VARIANTS:
        cmd = [sys.executable, __file__, "--child", "--variant", variant, "--model", str(work / "source")]
        cmd += ["--work", str(work), "--steps", str(steps), "--device", device, "--k", str(k)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{size} {variant} failed:\n{done.stderr[-3000:]}")
        rows[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    return rows


def tokens_per_step(work: Path) -> float:
    """Mean tokens (prompt and completion) per step of the uncaptured run, from its rollout log."""
    from behaviortrace.train.rolloutlog import RolloutLog

    rows = RolloutLog(work / "none" / "parts").read("rollouts")
    lengths = rows["prompt_ids"].list.len() + rows["completion_ids"].list.len()
    return float(lengths.sum()) / rows["step"].n_unique()


def paper_shapes(k: int) -> dict:
    """Parameters, matrix parameters, kept width and factored d of the paper's model, built on the meta device."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**PAPER_MODEL))
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "matrix_params": matrix_params(model),
        "kept_width": kept_width(model),
        "factored_dim": factored_dim(model, k),
    }


def hash_cache_mb(method: str, params: int) -> float:
    """What countsketch's cache of bucket hashes holds for a model of `params` parameters, in MB."""
    return HASH_CACHE_BYTES * min(params, HASH_CACHE_COORDS) / 2**20 if method == "countsketch" else 0.0


def fit(x: list[float], y: list[float]) -> tuple[float, float]:
    """Least-squares slope and intercept."""
    slope, intercept = np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)
    return float(slope), float(intercept)


HEADER = (
    "| size | params | tokens/step | s/step none | countsketch | ratio | factored | ratio "
    "| MB added none | countsketch | ratio | factored | ratio |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def row(r: dict) -> str:
    none, cs, fa = r["none"], r["countsketch"], r["factored"]
    base_mb = max(none["extra_mb"], 1.0)
    return (
        f"| {r['size']} | {none['params']:,} | {r['tokens']:.0f} | {none['step_s']:.3f} | {cs['step_s']:.3f} "
        f"| {cs['step_s'] / none['step_s']:.2f}x | {fa['step_s']:.3f} | {fa['step_s'] / none['step_s']:.2f}x "
        f"| {none['extra_mb']:.0f} | {cs['extra_mb']:.0f} | {cs['extra_mb'] / base_mb:.2f}x "
        f"| {fa['extra_mb']:.0f} | {fa['extra_mb'] / base_mb:.2f}x |"
    )


def extrapolate(results: list[dict], k: int) -> list[str]:
    """The fits of the module docstring, and what they give for the paper's setting."""
    paper = paper_shapes(k)
    lines = [
        f"Extrapolation to the paper's setting: Qwen2.5-1.5B ({paper['params'] / 1e9:.2f}B parameters, "
        f"{paper['matrix_params'] / 1e9:.2f}B in weight matrices, kept width {paper['kept_width']:,} floats per token, "
        f"factored d = {paper['factored_dim']}), {PAPER_ROLLOUTS} rollouts and {PAPER_TOKENS} tokens per step:"
    ]
    g, h = fit([r["tokens"] * r["none"]["params"] for r in results], [r["none"]["step_s"] for r in results])
    base = g * PAPER_TOKENS * paper["params"] + h
    lines.append(
        f"  uncaptured step: {g * 1e12:.3g} s per 1e12 (token x parameter) + {h:.3g} s -> {base:.3g} s at 1.5B "
        "on this device"
    )
    for method in ("countsketch", "factored"):
        extra_s = [r[method]["step_s"] - r["none"]["step_s"] for r in results]
        if method == "countsketch":
            x = [r["tokens"] * r["none"]["matrix_params"] for r in results]
            at, unit = PAPER_TOKENS * paper["matrix_params"], "token x matrix parameter"
        else:
            x = [r["tokens"] * r["none"]["kept_width"] * r["none"]["factored_dim"] for r in results]
            at, unit = PAPER_TOKENS * paper["kept_width"] * paper["factored_dim"], "token x kept width x d"
        a, b = fit(x, extra_s)
        extra = a * at + b
        cache = {n: hash_cache_mb(method, n) for n in [r["none"]["params"] for r in results] + [paper["params"]]}
        c, e = fit(
            [r["tokens"] * r["none"]["kept_width"] for r in results],
            [r[method]["extra_mb"] - r["none"]["extra_mb"] - cache[r["none"]["params"]] for r in results],
        )
        memory = (c * PAPER_TOKENS * paper["kept_width"] + e + cache[paper["params"]]) / 1024
        lines.append(
            f"  {method}: extra {a * 1e12:.3g} s per 1e12 ({unit}) + {b:.3g} s -> {extra:.3g} s per step at 1.5B, "
            f"ratio {(base + extra) / base:.2f}x on this device; extra memory {c * 1e6:.3g} MB per 1e6 "
            f"(token x kept width) -> {memory:.3g} GiB at 1.5B (float32 factors alone: "
            f"{4 * PAPER_TOKENS * paper['kept_width'] / 2**30:.3g} GiB"
            + (f"; hash cache {cache[paper['params']] / 1024:.2g} GiB)" if method == "countsketch" else ")")
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="*", default=list(DEFAULT_SIZES), help="hidden x layers, e.g. 64x2")
    parser.add_argument("--steps", type=int, default=6, help="training steps per variant (the first is not timed)")
    parser.add_argument("--k", type=int, default=65536, help="sketch width (the paper's by default)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--quick", action="store_true", help="the two smallest sizes, 3 steps")
    parser.add_argument("--json", type=Path, help="also write the measurements here, after each size")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    sizes, steps = (args.sizes[:2], 3) if args.quick else (args.sizes, args.steps)
    memory = "peak GPU memory added" if args.device == "cuda" else "peak RSS added"
    clock = "wall" if args.device == "cuda" else "CPU"
    print(f"GRPO steps with train-time capture against the same steps without it ({args.device}, k = {args.k}; time:")
    print(f"median {clock} seconds per step; memory: {memory} by training, MB)\n")
    print(HEADER, flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            work = Path(tmp) / size
            results.append({"size": size, **measure(size, steps, args.device, args.k, work)})
            results[-1]["tokens"] = tokens_per_step(work)
            print(row(results[-1]), flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    span = results[-1]["none"]["params"] / results[0]["none"]["params"]
    print(f"\n{results[0]['none']['rollouts']} rollouts per step; parameters span {span:.0f}x\n")
    if len(results) >= 2:
        print("\n".join(extrapolate(results, args.k)))


if __name__ == "__main__":
    main()
