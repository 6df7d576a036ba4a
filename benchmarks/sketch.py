"""How fast per-rollout sketching is, as ratios against baselines measured in the same run.

For the built-in tiny architecture and a random-init Qwen2 of about 30M parameters, with one step of
synthetic rollouts (64-token completions by default):

- `fwd+bwd`: one batched forward and backward over the step's rollouts (ordinary training work);
- `countsketch` / `factored`: sketching every rollout of the step (sketch, exact norm, fluency);
- `behavior+null pass`: the extra pass a marked rollout needs (its behavior-token and null-position
  shares, two copies of the step's rollouts in one pass), if every rollout of the step were marked;
- `naive`: one backward per rollout, then a dense Gaussian projection of the flat gradient, in blocks
  of columns generated from a seed (the matrix is far too large to store).

Then the peak memory of a sketch job (resident set size of a child process that sketches a shard into
a real Zarr store) for shards of 2, 8 and 32 steps, on both models.

    python benchmarks/sketch.py            # about 12 minutes on 2 CPU cores (the naive baseline: 4)
    python benchmarks/sketch.py --quick    # tiny model only, no naive baseline
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from behaviortrace.config.sections import Grpo  # noqa: E402
from behaviortrace.gradients.batch import completion_logps, pad_batch  # noqa: E402
from behaviortrace.sketch.maps import SketchMap  # noqa: E402
from behaviortrace.sketch.sketcher import StepSketcher  # noqa: E402
from behaviortrace.train.trl_surface import rollout_losses  # noqa: E402

MODELS = {  # Qwen2 shapes: the built-in tiny default, and one of about 30M parameters
    "tiny": dict(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
    "qwen2-30m": dict(
        vocab_size=8192,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
    ),
}
LOSS = Grpo(
    steps=1,
    prompts_per_step=1,
    num_generations=2,
    max_new_tokens=64,
    temperature=1.0,
    top_p=1.0,
    lr=1e-3,
    lr_scheduler="constant",
    warmup_steps=0,
    weight_decay=0.0,
    max_grad_norm=1.0,
    loss_type="dapo",
    beta=0.0,
    scale_rewards="group",
    save_every=1,
)


def build(name: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        **MODELS[name], max_position_embeddings=256, tie_word_embeddings=False, attn_implementation="eager"
    )
    return Qwen2ForCausalLM(cfg).eval()


def synthetic_step(vocab: int, rollouts: int, prompt_len: int, completion_len: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(2, vocab, (rollouts, prompt_len), generator=g).tolist()
    completions = torch.randint(2, vocab, (rollouts, completion_len), generator=g).tolist()
    batch = pad_batch(prompts, completions, pad_id=0)
    batch["advantages"] = torch.randn(rollouts, generator=g)
    return batch


def timed_together(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each function, measured in turns (a slow spell on the machine hits all of them)."""
    for fn in fns.values():
        fn()  # warm-up
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def fwd_bwd(model, batch):
    model.zero_grad(set_to_none=True)
    n = batch["advantages"].shape[0]
    rollout_losses(completion_logps(model, batch, 1.0), batch, "dapo", 0.0, LOSS.max_new_tokens).sum().backward()
    return n


def naive(model, batch, k: int, block: int = 2**20) -> torch.Tensor:
    """One backward per rollout, then project the flat gradients with a seeded Gaussian, block by block."""
    n = batch["advantages"].shape[0]
    num_items = int(batch["completion_mask"].sum())
    flats = []
    for i in range(n):
        model.zero_grad(set_to_none=True)
        row = {key: v[i : i + 1] for key, v in batch.items()}
        rollout_losses(
            completion_logps(model, row, 1.0), row, "dapo", 0.0, LOSS.max_new_tokens, num_items=num_items, n_rows=n
        ).sum().backward()
        flats.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    grads = torch.stack(flats)
    out = torch.zeros(n, k)
    for b, start in enumerate(range(0, grads.shape[1], block)):
        part = grads[:, start : start + block]
        gaussian = torch.randn(k, part.shape[1], generator=torch.Generator().manual_seed(b)) / k**0.5
        out += part @ gaussian.T
    return out


def sketcher_for(model, method: str, k: int) -> StepSketcher:
    smap = SketchMap.for_model(model, method, k, 0)
    return StepSketcher(smap, LOSS, tokenizer=None, marker="", marker_ids=[], chunk=10**9)


def sketch_all(sketcher: StepSketcher, model, batch, positions=None):
    n = batch["advantages"].shape[0]
    [(sketch, sq)], logits = sketcher.sketch_batch(model, batch, n, int(batch["completion_mask"].sum()), (positions,))
    return sketch, sq, logits


def speed(args) -> list[dict]:
    rows = []
    for name in ["tiny"] if args.quick else list(MODELS):
        model = build(name)
        n_params = sum(p.numel() for p in model.parameters())
        batch = synthetic_step(MODELS[name]["vocab_size"], args.rollouts, args.prompt_len, args.completion_len)
        positions = torch.zeros_like(batch["completion_ids"], dtype=torch.float32)
        null = positions.clone()
        positions[:, 10:12] = 1.0  # a two-token marker in every rollout
        null[:, 30:32] = 1.0
        doubled = {key: torch.cat([v, v]) for key, v in batch.items()}
        doubled_positions = torch.cat([positions, null])
        fns = {"fwd+bwd": lambda m=model, b=batch: fwd_bwd(m, b)}
        for method in ("countsketch", "factored"):
            sketcher = sketcher_for(model, method, args.k)
            fns[method] = lambda s=sketcher, m=model, b=batch: sketch_all(s, m, b)
            fns[f"{method} behavior+null pass"] = lambda s=sketcher, m=model, d=doubled, p=doubled_positions: (
                sketch_all(s, m, d, p)
            )
        measured = timed_together(fns, args.repeats)
        base = measured["fwd+bwd"]
        for what, t in measured.items():
            rows.append({"model": name, "params": n_params, "what": what, "seconds": t, "ratio": t / base})
        if not args.quick:
            start = time.perf_counter()
            naive(model, batch, args.k)  # minutes on a 30M model: measured once
            t = time.perf_counter() - start
            rows.append({"model": name, "params": n_params, "what": "naive", "seconds": t, "ratio": t / base})
        for r in rows:
            if r["model"] == name:
                r["rollouts_per_s"] = args.rollouts / r["seconds"]
        print(f"done: {name}", file=sys.stderr, flush=True)
    return rows


MEMORY_CHILD = """
import json, resource, runpy, types, torch
torch.set_num_threads({threads})
bench = types.SimpleNamespace(**runpy.run_path({script!r}))  # this script's functions, without its main
from pathlib import Path
import numpy as np, polars as pl
from behaviortrace.sketch.store import ShardWriter
model = bench.build({model!r})
sketcher = bench.sketcher_for(model, {method!r}, {k})
steps, n = {steps}, {rollouts}
rows = pl.DataFrame({{"rollout_id": list(range(steps * n)), "step": [s for s in range(steps) for _ in range(n)],
                      "checkpoint_step": [0] * (steps * n)}})
info = pl.DataFrame({{"step": list(range(steps)), "lr": [1e-3] * steps, "clip_coef": [1.0] * steps,
                      "grad_norm": [1.0] * steps}})
writer = ShardWriter(Path({out!r}), rows, info, sketcher.smap.k, sketcher.smap.attrs(), "bench", n)
for s in range(steps):
    batch = bench.synthetic_step(bench.MODELS[{model!r}]["vocab_size"], n, {prompt_len}, {completion_len}, seed=s)
    sk, sq, logits = bench.sketch_all(sketcher, model, batch)
    writer.write_step(s, {{"sketch": sk.numpy(), "norm": sq.sqrt().double().numpy(),
                          "behavior_sketch": np.zeros_like(sk.numpy()), "behavior_norm": np.zeros(n),
                          "null_sketch": np.zeros_like(sk.numpy()), "null_norm": np.zeros(n),
                          "has_marker": np.zeros(n, bool), "fluency": np.zeros(n, np.float32)}})
writer.finish()
# VmHWM: this process's own peak resident set (ru_maxrss can report the parent's peak after a fork)
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({{"peak_rss_mb": int(hwm.split()[1]) / 1024}}))
"""


def memory(args) -> list[dict]:
    rows = []
    for name in ["tiny"] if args.quick else list(MODELS):
        for steps in (2, 8, 32):
            with tempfile.TemporaryDirectory() as tmp:
                code = MEMORY_CHILD.format(
                    script=str(Path(__file__)),
                    threads=args.threads,
                    model=name,
                    method="countsketch",
                    k=args.k,
                    steps=steps,
                    rollouts=args.rollouts,
                    out=str(Path(tmp) / "shard.zarr"),
                    prompt_len=args.prompt_len,
                    completion_len=args.completion_len,
                )
                res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                peak = json.loads(res.stdout.strip().splitlines()[-1])["peak_rss_mb"]
            rows.append({"model": name, "steps": steps, "rollouts": steps * args.rollouts, "peak_rss_mb": peak})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--k",
        type=int,
        default=512,
        help="sketch width for every method (default 512; the naive baseline's time grows with k)",
    )
    ap.add_argument("--rollouts", type=int, default=16, help="rollouts in the step (default 16)")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--completion-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="tiny model only, no naive baseline")
    ap.add_argument("--part", choices=["all", "speed", "memory"], default="all")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"# sketch benchmark: one step of {args.rollouts} rollouts, {args.prompt_len}-token prompts, "
        f"{args.completion_len}-token completions, k={args.k}, {args.threads} threads, torch {torch.__version__}\n"
    )
    if args.part in ("all", "memory"):
        print("| model | shard steps | rollouts in shard | peak RSS of the sketch job (MB) |")
        print("|---|---|---|---|")
        for r in memory(args):
            print(f"| {r['model']} | {r['steps']} | {r['rollouts']} | {r['peak_rss_mb']:.0f} |")
        print()
    if args.part in ("all", "speed"):
        print("| model | parameters | what | seconds per step | rollouts/s | ratio to fwd+bwd |")
        print("|---|---|---|---|---|---|")
        for r in speed(args):
            print(
                f"| {r['model']} | {r['params']:,} | {r['what']} | {r['seconds']:.3f} | {r['rollouts_per_s']:.1f} "
                f"| {r['ratio']:.2f} |"
            )


if __name__ == "__main__":
    main()
