"""What each stage of the workflow costs as the model grows, and what that makes of config/paper.yaml.

Runs the GPU check's reduced workflow (diagnostics/gpu_check.py: GRPO with train-time capture at k = 65,536,
targets, scoring, one leave-out replay with its random removal, the exact influence with its saved states, and LDS
subsets) on Qwen2 models built here at several sizes, one after another on every core, on this machine's device.
Per size and rule it reads every job's wall time and peak resident memory (Snakemake's benchmark files) and the
disk each stage's outputs take.

Then, per rule, least-squares fits over the sizes against the parameter count P:
  - a job's wall seconds = c + a * P: a fixed part (starting Python, reading the logs) and a part that grows with
    the model (a forward and backward pass per token is about 6 P flops);
  - a job's peak memory = c + a * P, and each stage's disk = c + a * P.
Extrapolated to config/paper.yaml's model (Qwen2.5-1.5B-Instruct's shapes, on the meta device: nothing is
downloaded) and scaled by how much more work one of its jobs does than a reduced job does (the `work` column: the
steps it runs through times the tokens per rollout, or the rollouts it scores), times its number of jobs (a dry
run of config/paper.yaml). The influence job's temporary states are not left on disk, so they are counted from
their size: 3 P numbers per state (weights and Adam's two moments), ceil(T / influence.segment_steps) states.

Then the same sizes again with LoRA adapters (the GPU check's: rank 8 on q and v; `--no-lora` skips them), fitted
the same way, and config/paper.yaml extrapolated both ways at 1.5B and at Qwen2.5-7B's shapes: time and memory with
the whole model's P, what holds trainable weights (checkpoints, Adam's moments, the influence's states) with the
parameters trained. Last, the influence's states in memory and on disk at other influence.segment_steps.

The hours are this device's: run on the CPU they are CPU hours of this machine, not GPU hours. The script runs the
same on CUDA (`--device cuda`), where its table is the GPU plan.

    python benchmarks/cost_plan.py --markdown docs/cost_plan.md              # 4 sizes up to 113M, twice: ~50 min
    python benchmarks/cost_plan.py --sizes 128x2 256x4 --steps 2             # a quick look
    python benchmarks/cost_plan.py --device cuda --sizes 512x8 1024x12 1536x16 2048x24
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from behaviortrace.config.load import defaults  # noqa: E402
from behaviortrace.tools.workflows import LORA, PAPER_MODEL  # noqa: E402

DEFAULT_SIZES = ("128x4", "384x6", "640x8", "1024x12")  # hidden width x layers: 0.6M to 113M parameters
# Qwen2.5-7B-Instruct's shapes (its config.json), beside config/paper.yaml's 1.5B for what LoRA saves.
QWEN_7B = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}
PROMPT_TOKENS = 48  # the chat template's and the task's prompt tokens (benchmarks/capture_scaling.py)
# Per rule, what its work grows with beyond the model (work_units): the steps a job runs through times the tokens per
# rollout (training, a replay, the influence), the probe completions it samples (targets: for every draw), the
# rollouts it reads, or those times the draws and target kinds it scores them against (score, score_model). Other
# rules: per job.
WORK = {
    "train_grpo": "train",
    "replay": "replay",
    "influence": "influence",
    "influence_set": "influence",
    "targets": "drawn_probes",
    "behavior": "probes",
    "score": "scored_cells",
    "score_target_free": "rollouts",
    "score_model": "scored_cells",
    "sketch_gram": "rollouts",
    "sketch_matrix": "rollouts",
    "evaluate": "rollouts",
}


# The rules that run the model (the workflow's GPU rules); every other rule reads files the model wrote.
MODEL_RULES = {
    "base_model",
    "train_grpo",
    "sketch",
    "targets",
    "behavior",
    "replay",
    "influence",
    "influence_set",
    "score_model",
}


def influence_end(cfg: dict) -> int:
    """T, the steps the influence job runs through (the influence stage's own definition)."""
    from behaviortrace.config.sections import Config
    from behaviortrace.influence.inputs import end_step

    return end_step(Config.from_dict(cfg))


def work_units(cfg: dict) -> dict[str, float]:
    """How much one job of each kind of rule does, in steps x tokens or in rollouts, under config `cfg`."""
    grpo, probes, targets = cfg["grpo"], cfg["probes"], cfg["targets"]
    tokens = PROMPT_TOKENS + grpo["max_new_tokens"]
    window_end = cfg["planting"]["window"][1] + 1
    measured = max(grpo["steps"] if m == "final" else window_end for m in cfg["replay"]["measure_at"])
    rollouts = grpo["steps"] * grpo["prompts_per_step"] * grpo["num_generations"]
    sampled = (probes["n_probes"] + probes["n_plain"]) * targets["samples_per_prompt"] * tokens
    return {
        "train": grpo["steps"] * tokens,
        "replay": measured * tokens,
        "influence": influence_end(cfg) * tokens,
        "probes": sampled,
        "drawn_probes": sampled * targets["draws"],
        "rollouts": rollouts,
        "scored_cells": rollouts * targets["draws"] * len(cfg["evaluation"]["target_kinds"]),
    }


def states_in_memory(cfg: dict) -> int:
    """The influence job holds a segment's states in host memory: min(T, influence.segment_steps) of them."""
    return min(influence_end(cfg), cfg["influence"]["segment_steps"])


def influence_state_bytes(cfg: dict, params: int) -> float:
    """The influence job's temporary states: 3 P numbers each (weights, Adam's moments), ceil(T / segment) of them."""
    from behaviortrace.influence.resources import state_bytes

    return state_bytes(params, cfg["influence"]["dtype"]) * math.ceil(
        influence_end(cfg) / cfg["influence"]["segment_steps"]
    )


def job_counts(cfg: dict, work: Path) -> dict[str, int]:
    """Jobs per rule of a whole run under `cfg`: Snakemake's dry run (loads no model)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "plan.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "snakemake", "-n", "-s", str(ROOT / "Snakefile"), "--directory", str(work)]
    out = subprocess.run(cmd + ["--configfile", str(work / "plan.yaml")], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"dry run failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    table = out.stdout.split("Job stats:")[1].split("total")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m[1] != "all"}


def paper_config(model_dir: Path | None = None) -> dict:
    """config/paper.yaml over the defaults; for its dry run, a local model folder standing in for the hub id."""
    from behaviortrace.config.load import complete

    cfg = complete(yaml.safe_load((ROOT / "config" / "paper.yaml").read_text()))
    if model_dir is not None:
        cfg["model"]["name"] = str(model_dir)
    return cfg


def model_params(config) -> tuple[int, int]:
    """A model's parameters, and those LoRA's adapters (the GPU check's: rank 8 on q and v) would train, counted
    on the meta device from its transformers config: nothing is downloaded or allocated."""
    from behaviortrace.model.lora import adapter_parameters
    from behaviortrace.model.meta import meta_model

    model = meta_model(config)
    total = sum(p.numel() for p in model.parameters())
    return total, adapter_parameters(model, LORA["rank"], LORA["target_modules"])


def qwen2(shapes: dict):
    from transformers import Qwen2Config

    return Qwen2Config(**shapes)


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def measure(size: str, device: str, steps: int, cores: int, work: Path, lora: bool = False) -> dict:
    """The reduced workflow at one size (with LoRA adapters, `lora`): per rule its jobs, mean seconds per job and
    peak memory; disk per stage."""
    from transformers import AutoConfig

    from behaviortrace.model.families import save_family
    from behaviortrace.report.cost import read_benchmarks
    from behaviortrace.tools.workflows import Workflow, reduced_config, run_side_by_side

    hidden, layers = (int(x) for x in size.split("x"))
    plant = defaults()["planting"]
    model_dir = save_family(
        "qwen2_tied", work / "model", plant["trigger"], plant["marker"], hidden=hidden, layers=layers
    )
    params, adapter = model_params(AutoConfig.from_pretrained(model_dir))
    cfg = reduced_config(model_dir, device, "float32", steps, lora)
    cfg["run"] = "cost"
    started = time.time()
    flow = Workflow(work / "run", cfg, cores)
    run_side_by_side({"run": flow}, deadline=time.time() + 6 * 3600)
    if flow.code:
        raise RuntimeError(f"size {size}: the workflow failed (exit {flow.code}); see {flow.log_path}")
    results = work / "run" / "results" / "cost"
    jobs = read_benchmarks(results / "benchmarks")
    rules = {}
    for rule in sorted(set(jobs["rule"])):
        part = jobs.filter(jobs["rule"] == rule)
        rules[rule] = {"jobs": part.height, "wall_s": part["wall_s"].mean(), "rss_mb": part["max_rss_mb"].max()}
    seed = results / "planted0"
    disk = {child.name: du(child) for child in sorted(seed.iterdir()) if child.is_dir() and child.name != "train"}
    for child in sorted((seed / "train").iterdir()):  # checkpoints and Adam's states apart from the capture's parts
        name = "train/" + ("checkpoints" if child.name.startswith("checkpoint-") else child.name)
        disk[name] = disk.get(name, 0) + (du(child) if child.is_dir() else child.stat().st_size)
    disk["base_model"] = du(results / "base_model")
    return {
        "size": size,
        "params": params,
        "trainable": adapter if lora else params,
        "elapsed_s": time.time() - started,
        "rules": rules,
        "disk": disk,
        "cfg": cfg,
    }


def fit(x: list[float], y: list[float]) -> tuple[float, float, float]:
    """Least-squares c + a x: (c, a, the largest relative residual over the points)."""
    a, c = np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)
    worst = max(abs(c + a * xi - yi) / max(abs(yi), 1e-9) for xi, yi in zip(x, y, strict=True))
    return float(c), float(a), float(worst)


def plan(
    sizes: list[dict], paper: dict, paper_P: int, trained: int, paper_jobs: dict[str, int]
) -> tuple[list[dict], dict]:
    """Per rule: the fit, and one paper.yaml job's and all its jobs' time and peak memory; the disk per seed. Time
    and memory grow with the model's P (the passes run through every weight); what holds trainable weights
    (checkpoints, Adam's moments, the influence's states) with the `trained` parameters (LoRA: the adapters')."""
    from behaviortrace.influence.resources import state_bytes

    P = [s["params"] for s in sizes]
    largest = sizes[-1]
    reduced, target = work_units(largest["cfg"]), work_units(paper)
    rows = []
    for rule in sorted(set.intersection(*(set(s["rules"]) for s in sizes))):
        wall = [s["rules"][rule]["wall_s"] for s in sizes]
        rss = [s["rules"][rule]["rss_mb"] for s in sizes]
        c, a, worst = fit(P, wall)
        kind = WORK.get(rule)
        ratio = target[kind] / reduced[kind] if kind else 1.0
        # The exponent between the two largest sizes: where it is above 1 the linear fit underestimates.
        exponent = math.log(wall[-1] / wall[-2]) / math.log(P[-1] / P[-2])
        if rule in MODEL_RULES:  # the fixed part stays; the part that grows with P grows with the work too
            job_s = c + max(a, 0.0) * paper_P * ratio
            power_s = wall[-1] * (paper_P / P[-1]) ** exponent * ratio
            mc, ma, _ = fit(P, rss)
            rss_mb = max(mc + ma * paper_P, max(rss))
            if rule == "influence":  # the paper holds more states in memory than the few steps did
                more = states_in_memory(paper) - states_in_memory(largest["cfg"])
                rss_mb += more * state_bytes(trained, paper["influence"]["dtype"]) / 2**20
        else:  # no model: the whole measured job (start-up included) times the work, an upper bound
            job_s = power_s = wall[-1] * ratio
            rss_mb = rss[-1]
        n = paper_jobs.get(rule, 0)
        rows.append(
            {
                "rule": rule,
                "model": rule in MODEL_RULES,
                "c_s": c,
                "a_s_per_param": a,
                "worst": worst,
                "work": ratio,
                "paper_job_h": job_s / 3600,
                "paper_jobs": n,
                "paper_h": n * job_s / 3600,
                "exponent": exponent,
                "paper_power_h": n * power_s / 3600,
                "rss_gb": rss_mb / 1024,
                "measured_s": [round(w, 2) for w in wall],
            }
        )
    # Disk: what holds weights grows with P and the checkpoints saved; the rest with the rollouts (k is the same).
    red = largest["cfg"]["grpo"]
    saves = (paper["grpo"]["steps"] // paper["grpo"]["save_every"] + 1) / (red["steps"] // red["save_every"] + 1)
    grow, trains = paper_P / largest["params"], trained / largest["trainable"]
    disk = {}
    for stage, size in largest["disk"].items():
        factor = {"train/checkpoints": trains * saves, "train/adam": trains * saves, "base_model": grow}.get(
            stage, target["rollouts"] / reduced["rollouts"]
        )
        disk[stage] = size * factor
    disk["influence states (temporary)"] = influence_state_bytes(paper, trained)
    return rows, disk


def markdown(sizes: list[dict], rows: list[dict], disk: dict, paper_P: int, device: str, machine: str) -> str:
    unit = "GPU" if device == "cuda" else "CPU"
    names = ", ".join(s["size"] for s in sizes)
    total = sum(r["paper_h"] for r in rows)
    power = sum(r["paper_power_h"] for r in rows)
    lines = [
        f"# Cost plan of config/paper.yaml, measured on {machine}",
        "",
        "Written by `benchmarks/cost_plan.py`; [cluster.md](cluster.md) says how to read it. **Measured**: the GPU "
        "check's reduced workflow (float32, k = 65,536, 4 GRPO steps of 16 rollouts) at "
        + ", ".join(f"{s['size']} ({s['params'] / 1e6:.1f}M parameters: {s['elapsed_s'] / 60:.1f} min)" for s in sizes)
        + f". **Extrapolated**: every hour, memory and disk figure at the paper's {paper_P / 1e9:.2f}B parameters.",
        "",
        f"## Time: {min(total, power):,.0f} to {max(total, power):,.0f} {unit} hours per run of config/paper.yaml "
        "on this device",
        "",
        f"Jobs one after another: {total:,.0f} from the linear fits, {power:,.0f} from the power laws.",
        "",
        "Rules that run the model: a job's seconds fitted as c + a P over the sizes (largest residual relative to "
        "the measured time), evaluated at the paper's P with the part that grows with P times the work ratio "
        "(steps run through x tokens per rollout, or probe completions, or rollouts, times the draws and target "
        "kinds for score_model, of a paper job over a reduced one). Beside it, a power law through the two largest "
        "sizes with their exponent: where the exponent is above 1 "
        "(work that grows faster than the parameters, such as EK-FAC's eigendecompositions) the linear fit "
        "underestimates, and the two bracket the estimate. Peak memory: c + a P as well (the influence job's: plus "
        "the states it holds beyond the reduced run's, 12 bytes per parameter each).",
        "",
        f"| rule | s per job measured ({names}) | ratio to the smallest | fit c (s) | fit a (s per M params) "
        f"| largest residual | exponent, two largest | work ratio | paper jobs | {unit} h per job | {unit} h in all "
        f"| {unit} h in all, power law | peak memory GB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted((r for r in rows if r["model"]), key=lambda r: -r["paper_h"]):
        m = r["measured_s"]
        lines.append(
            f"| {r['rule']} | {' / '.join(f'{v:.1f}' for v in m)} | {m[-1] / m[0]:.1f}x | {r['c_s']:.1f} "
            f"| {r['a_s_per_param'] * 1e6:.3g} | {r['worst']:.0%} | {r['exponent']:.2f} | {r['work']:.0f} "
            f"| {r['paper_jobs']} | {r['paper_job_h']:.3g} | {r['paper_h']:.3g} | {r['paper_power_h']:.3g} "
            f"| {r['rss_gb']:.1f} |"
        )
    lines += [
        "",
        "Rules that read what the model wrote (no model): the largest size's whole job, start-up included, times the "
        "work ratio: an upper bound. Peak memory: the largest size's (sketch-reading jobs grow with rollouts x k).",
        "",
        f"| rule | s per job measured ({names}) | work ratio | paper jobs | {unit} h in all | peak memory GB |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted((r for r in rows if not r["model"]), key=lambda r: -r["paper_h"]):
        lines.append(
            f"| {r['rule']} | {' / '.join(f'{v:.1f}' for v in r['measured_s'])} | {r['work']:.0f} | {r['paper_jobs']} "
            f"| {r['paper_h']:.3g} | {r['rss_gb']:.1f} |"
        )
    lines += [
        "",
        "## Disk per seed",
        "",
        "Measured at the largest size, scaled to the paper: what holds weights (checkpoints, Adam's second moment, "
        "the base model) by parameters and checkpoints saved (an upper bound: the newest checkpoint's optimizer "
        "state is counted at every checkpoint), the rest by rollouts; the influence job's temporary "
        "states counted from their size (3 P float32 numbers each, ceil(T / influence.segment_steps) of them).",
        "",
        "| what | GB |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v / 1e9:.2f} |" for k, v in sorted(disk.items(), key=lambda kv: -kv[1]) if v >= 5e6]
    lines += [f"| in all | {sum(disk.values()) / 1e9:.1f} |", ""]
    return "\n".join(lines)


def segments_markdown(paper: dict, trained: dict[str, int]) -> str:
    """The influence job's states at other influence.segment_steps M: min(T, M) in host memory, ceil(T / M) on disk,
    every segment but the last recomputed (influence/metagradient.py). Arithmetic on parameter counts: no fit."""
    from behaviortrace.influence.resources import state_bytes

    T = influence_end(paper)
    chosen = paper["influence"]["segment_steps"]
    options = sorted({T, chosen, 2 * chosen, max(1, chosen // 2), max(1, chosen // 4)}, reverse=True)
    lines = [
        "## The influence job's states by influence.segment_steps",
        "",
        f"T = {T} steps; each state is 3 x the trained parameters, {paper['influence']['dtype']}. A job holds "
        "min(T, M) states in host memory (refused before its forward sweep where they cannot fit, as are states the "
        "disk cannot hold) and saves ceil(T / M) on disk; it recomputes every segment but the last. "
        f"config/paper.yaml has M = {chosen}.",
        "",
        "| M | " + " | ".join(f"{name}: memory GB | {name}: disk GB" for name in trained) + " | steps recomputed |",
        "|---|" + "---|---|" * len(trained) + "---|",
    ]
    for M in options:
        cells = []
        for params in trained.values():
            state = state_bytes(params, paper["influence"]["dtype"]) / 1e9
            cells.append(f"{min(T, M) * state:,.1f} | {math.ceil(T / M) * state:,.1f}")
        lines.append(f"| {M}{' (paper.yaml)' if M == chosen else ''} | {' | '.join(cells)} | {M * ((T - 1) // M)} |")
    lines.append("")
    return "\n".join(lines)


def lora_markdown(full: list[dict], lora: list[dict], plans: list[dict], paper: dict, device: str) -> str:
    """What LoRA saves: its measured time and memory per rule beside full training at the largest size, and
    config/paper.yaml at 1.5B and 7B both ways."""
    unit = "GPU" if device == "cuda" else "CPU"
    big, small = full[-1], lora[-1]
    lines = [
        "## What LoRA saves at 1.5B and 7B",
        "",
        f"**Measured**: the same reduced workflow with `model.lora` (rank {LORA['rank']}, alpha {LORA['alpha']:g}, on "
        f"{' and '.join(LORA['target_modules'])}; float32) at the same sizes: "
        + ", ".join(f"{s['size']} ({s['trainable']:,} adapter parameters: {s['elapsed_s'] / 60:.1f} min)" for s in lora)
        + f". Per rule at {big['size']}, one job:",
        "",
        "| rule | s full | s LoRA | LoRA / full | peak memory MB full | LoRA |",
        "|---|---|---|---|---|---|",
    ]
    for rule in sorted(MODEL_RULES & set(big["rules"]) & set(small["rules"])):
        a, b = big["rules"][rule], small["rules"][rule]
        lines.append(
            f"| {rule} | {a['wall_s']:.1f} | {b['wall_s']:.1f} | {b['wall_s'] / a['wall_s']:.2f} | {a['rss_mb']:.0f} "
            f"| {b['rss_mb']:.0f} |"
        )
    lines += [
        "",
        "**Extrapolated**: config/paper.yaml with its own model (Qwen2.5-1.5B-Instruct's shapes) and with "
        "Qwen2.5-7B-Instruct's (3584 wide, 28 layers, 28 heads, 4 key-value heads), each series fitted as above. "
        "Time and memory grow with the whole model (every pass runs through the frozen weights too); checkpoints, "
        "Adam's moments and the influence's states with the trained parameters. The influence job's host memory "
        f"holds min(T, influence.segment_steps) = {states_in_memory(paper)} states.",
        "",
        f"| model | trains | trained parameters | {unit} h in all (linear fits to power laws) | influence job's "
        "peak memory GB | other rules' largest peak memory GB | disk per seed GB | of it influence states GB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in plans:
        hours = sorted((sum(r["paper_h"] for r in p["rows"]), sum(r["paper_power_h"] for r in p["rows"])))
        rss = {r["rule"]: r["rss_gb"] for r in p["rows"]}
        other = max((r for r in p["rows"] if r["rule"] != "influence"), key=lambda r: r["rss_gb"])
        lines.append(
            f"| {p['name']} ({p['P'] / 1e9:.2f}B) | {'LoRA' if p['lora'] else 'full'} | {p['trained']:,} "
            f"| {hours[0]:,.0f} to {hours[1]:,.0f} | {rss['influence']:,.1f} | {other['rss_gb']:,.1f} "
            f"({other['rule']}) | {sum(p['disk'].values()) / 1e9:,.1f} "
            f"| {p['disk']['influence states (temporary)'] / 1e9:,.2f} |"
        )
    lines.append("")
    return "\n".join(lines)


def device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    cpuinfo = Path("/proc/cpuinfo")
    names = [
        line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")
    ]
    return f"{names[0] if names else platform.machine()}, {os.cpu_count()} cores (no GPU)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=list(DEFAULT_SIZES), help="hidden width x layers")
    ap.add_argument("--steps", type=int, default=4, help="GRPO steps of each reduced workflow (even)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--no-lora", action="store_true", help="skip the sizes again with LoRA adapters")
    ap.add_argument("--work", type=Path, default=ROOT / "cost_plan_work", help="scratch folder (deleted after)")
    ap.add_argument("--markdown", type=Path, help="also write the plan here")
    ap.add_argument("--json", type=Path, help="also write the measurements and fits here")
    ap.add_argument("--from-json", type=Path, help="the plan again from measurements a --json run wrote")
    args = ap.parse_args()
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        sizes, lora, paper_jobs = saved["sizes"], saved["lora_sizes"], saved["paper_jobs"]
        args.device, machine = saved["device"], saved["machine"]
    else:
        sizes, lora, machine = [], [], device_name(args.device)
        for size, adapters in [(s, False) for s in args.sizes] + [(s, True) for s in args.sizes if not args.no_lora]:
            folder = args.work / size
            shutil.rmtree(folder, ignore_errors=True)
            found = measure(size, args.device, args.steps, os.cpu_count() or 1, folder, adapters)
            (lora if adapters else sizes).append(found)
            print(
                f"{size}: {found['trainable']:,} of {found['params']:,} parameters trained, {found['elapsed_s']:.0f} s",
                flush=True,
            )
            shutil.rmtree(folder / "run" / "results", ignore_errors=True)
        paper_jobs = job_counts(paper_config(args.work / sizes[0]["size"] / "model"), args.work / "plan")
        shutil.rmtree(args.work, ignore_errors=True)
    paper = paper_config()
    counts = {name: model_params(qwen2(shapes)) for name, shapes in (("1.5B", PAPER_MODEL), ("7B", QWEN_7B))}
    paper_P = counts["1.5B"][0]
    rows, disk = plan(sizes, paper, paper_P, paper_P, paper_jobs)
    text = markdown(sizes, rows, disk, paper_P, args.device, machine)
    trained = {
        f"{name} {how}": n for name, (P, adapter) in counts.items() for how, n in (("full", P), ("LoRA", adapter))
    }
    text += "\n" + segments_markdown(paper, trained)
    if lora:
        plans = []
        for name, (P, adapter) in counts.items():
            for series, trained in ((sizes, P), (lora, adapter)):
                found, space = plan(series, paper, P, trained, paper_jobs)
                plans.append(
                    {"name": name, "lora": series is lora, "P": P, "trained": trained, "rows": found, "disk": space}
                )
        text += "\n" + lora_markdown(sizes, lora, plans, paper, args.device)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        saved = {"device": args.device, "machine": machine, "sizes": sizes, "lora_sizes": lora}
        args.json.write_text(json.dumps(saved | {"paper_jobs": paper_jobs, "rules": rows, "disk": disk}, indent=1))


if __name__ == "__main__":
    main()
