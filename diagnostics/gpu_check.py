"""The GPU check: a reduced workflow with a real-architecture model, train-time capture on, in float32 and in
bfloat16, one summary file, and a non-zero exit on any failure. diagnostics/gpu_check.sh runs it on a CUDA machine;
`--device cpu` runs the same on the CPU (tests/test_diagnostics.py does, in bf16).

The model is built here (model/families.py: a Qwen2 with tied embeddings and a chat template, as the paper's
Qwen2.5-1.5B-Instruct, at a size a GPU trains in seconds) and saved to a folder that `model.name` names, so nothing
is downloaded. Each dtype's workflow runs in a folder of its own, side by side on a share of the cores, with the
default config reduced (one seed, no placebo, a short schedule with a short SFT warm-up, fewer estimators and
replays) and `compute.device` forced, so a machine without the device fails instead of falling back.

Beside the dtypes, the same workflow trains LoRA adapters (`model.lora`, rank 8 on the attention's q and v
projections) in bfloat16 (`--no-lora` skips it): capture, the self-check, replay and the influence then cover the
adapter's parameters only, under mixed precision.

Beside them, config/paper.yaml itself reduced to a few steps (`--no-paper` skips it): its bf16, k = 65,536, step
shape (16 rollouts of 64 new tokens), lr, sampling and chat prompts, on a Qwen2 with the paper model's widths and
heads (on the CPU dry run, small widths), with fewer probes, estimators and replays.

Checked per run: the workflow finished; every captured step's self-check error is within that dtype's tolerance
(sketch/tolerance.py) and the checklist's sketch item passed; the prompts reached the model through its chat
template. Recorded: the self-check errors, the wall time and peak resident memory per rule (Snakemake's benchmark
files), and on CUDA the training job's peak GPU memory (its log), the peak in use on the GPUs while they all ran
(nvidia-smi, every 200 ms), and the capture scaling benchmark on the GPU in the time left.

    python diagnostics/gpu_check.py --out gpu_check_out                     # CUDA, both dtypes
    python diagnostics/gpu_check.py --device cpu --dtypes bfloat16 --out x  # the same on the CPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
ROOT = Path(__file__).resolve().parents[1]

import yaml  # noqa: E402

from behaviortrace.config.load import defaults  # noqa: E402
from behaviortrace.model.meta import meta_model  # noqa: E402
from behaviortrace.tools.workflows import Workflow, reduced_config, run_name, run_side_by_side  # noqa: E402

SUMMARY = "gpu_check_summary.json"
FAMILY, HIDDEN, LAYERS = "qwen2_tied", 128, 4


# config/paper.yaml's model, Qwen2.5-1.5B-Instruct: its widths and heads (its config.json), 4 of its 28 layers (its
# checkpoints, Adam states and influence states then fit the check's minutes and a 64 GB disk; benchmarks/cost_plan.py
# extrapolates over size) and the local tokenizer's vocabulary. On the CPU dry run: the same heads, small widths.
PAPER_SHAPES = {
    "cuda": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 4, "num_attention_heads": 12},
    "cpu": {"hidden_size": 96, "intermediate_size": 560, "num_hidden_layers": 2, "num_attention_heads": 12},
}


def paper_config(model_dir: Path, device: str, steps: int) -> dict:
    """config/paper.yaml reduced to a few steps (one seed, fewer probes, estimators and replays): its dtype, sketch
    width, step shape (4 prompts x 4 generations, 64 new tokens), lr, sampling, chat prompts and tolerance kept."""
    from behaviortrace.config.load import complete

    cfg = complete(yaml.safe_load((ROOT / "config" / "paper.yaml").read_text()))
    small = reduced_config(model_dir, device, "bfloat16", steps)
    cfg.update(run="gpu_check_paper", seeds=[0])
    cfg["compute"]["device"] = device
    cfg["model"]["name"] = str(model_dir)
    cfg["model"]["sft"].update(steps=4)
    cfg["grpo"].update(steps=steps, save_every=steps // 2)
    cfg["planting"]["window"] = [0, steps // 2 - 1]
    cfg["sketch"]["shard_steps"] = steps // 2
    cfg["planting"]["explore"] = small["planting"]["explore"]  # paid rollouts within a few steps of a random model
    for section in ("probes", "targets", "estimators", "evaluation", "replay", "placebo"):
        cfg[section] = small[section]
    cfg["influence"].update(sets=small["influence"]["sets"], lds_subsets=small["influence"]["lds_subsets"])
    return cfg


class GpuMemory:
    """Peak memory in use on the GPUs, sampled with nvidia-smi while the workflows run (every process counted)."""

    def __init__(self):
        self.peak_mib, self._proc, self._thread = 0.0, None, None

    def __enter__(self):
        cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-lms", "200"]
        try:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except FileNotFoundError:
            return self
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self):
        for line in self._proc.stdout:
            try:
                self.peak_mib = max(self.peak_mib, sum(float(x) for x in line.split(",")))
            except ValueError:
                continue

    def __exit__(self, *exc):
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
        return False


def rule_times(results: Path) -> tuple[dict[str, float], dict[str, float]]:
    """Wall seconds per rule, summed over its jobs, and each rule's peak resident memory in MB (Snakemake's benchmark
    files)."""
    from behaviortrace.report.cost import per_rule, read_benchmarks

    rows = list(per_rule(read_benchmarks(results / "benchmarks")).iter_rows(named=True))
    return {r["rule"]: round(r["wall_s"], 2) for r in rows}, {r["rule"]: r["peak_rss_mb"] for r in rows}


def check_outputs(results: Path, dtype: str) -> tuple[dict, list[str]]:
    """Self-check errors, the checklist's sketch item and the prompt format of a finished run; failures found."""
    import polars as pl

    from behaviortrace.sketch.store import read_steps
    from behaviortrace.sketch.tolerance import tolerance_for

    failures = []
    stores = sorted((results / "planted0" / "sketch").glob("shard*.zarr"))
    steps = read_steps(stores) if stores else pl.DataFrame({"self_check_error": []})
    errors = [float(e) for e in steps["self_check_error"].to_list()]
    tolerance = tolerance_for(dtype)
    if not errors:
        failures.append(f"{dtype}: no captured steps in {results / 'planted0' / 'sketch'}")
    elif max(errors) > tolerance:
        failures.append(f"{dtype}: self-check error {max(errors):.2e} above the tolerance {tolerance:.1e}")
    checklist = json.loads((results / "checklist.json").read_text()) if (results / "checklist.json").exists() else {}
    covers = _item(checklist, "sketch_covers_parameters")
    if covers is not True:
        failures.append(f"{dtype}: checklist item sketch_covers_parameters is {covers!r}, not a pass")
    rollouts = pl.read_parquet(results / "planted0" / "rollouts.parquet")
    chat = bool(rollouts["prompt"].str.contains("<|im_start|>", literal=True).all())
    if not chat:
        failures.append(f"{dtype}: the logged prompts are not in the model's chat format")
    found = {
        "self_check_errors": errors,
        "self_check_max": max(errors) if errors else None,
        "tolerance": tolerance,
        "sketch_covers_parameters": covers,
        "chat_prompts": chat,
        "rollouts": rollouts.height,
    }
    return found, failures


def check_adapter(results: Path) -> tuple[int | None, list[str]]:
    """The trainable parameters the run's sketches cover: LoRA's adapters alone, far fewer than the model's."""
    from behaviortrace.common.device import resolve
    from behaviortrace.config.sections import Compute
    from behaviortrace.model import lora, models

    # The workflow's paths (checkpoints, the base model an adapter names) are relative to its own folder.
    with contextlib.chdir(results.parents[1]):
        checkpoint = Path(json.loads((results / "planted0" / "checkpoints.json").read_text())["checkpoints"][0]["path"])
        if not lora.is_adapter(checkpoint):
            return None, ["the step-0 checkpoint holds no LoRA adapter"]
        model = models.load(checkpoint, resolve(Compute(device="cpu", dtype="float32")))[0]
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    bad = [] if 0 < trainable < total / 10 else [f"{trainable} of {total} parameters trainable: not an adapter"]
    return trainable, bad


def _item(checklist: dict, name: str):
    """A run item's verdict: True for a pass, None where the checklist does not have it."""
    verdict = checklist.get("run", {}).get(name, {}).get("verdict")
    return verdict == "pass" if verdict else None


def training_peak_mib(results: Path) -> float | None:
    """The training job's own peak GPU memory, from its log (jobs/train.py writes it on CUDA)."""
    from behaviortrace.train.outputs import PEAK_GPU_MEMORY

    for line in (results / "logs" / "train_grpo" / "planted0.log").read_text().splitlines():
        if PEAK_GPU_MEMORY in line:
            return float(line.split(PEAK_GPU_MEMORY)[1].split()[0])
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the runs and the summary file")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=("float32", "bfloat16"))
    parser.add_argument("--steps", type=int, default=8, help="GRPO steps of each reduced workflow (even)")
    parser.add_argument("--no-lora", action="store_true", help="skip the bfloat16 workflow with LoRA adapters")
    parser.add_argument("--no-paper", action="store_true", help="skip the reduced config/paper.yaml workflow")
    parser.add_argument(
        "--budget",
        type=float,
        default=510,
        help="seconds for everything (the scaling benchmark runs only in what the workflows leave)",
    )
    args = parser.parse_args()
    started = time.time()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"device": args.device, "dtypes": args.dtypes, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    failures: list[str] = []
    try:
        summary.update(environment(args.device))
        if args.device == "cuda" and not summary.get("cuda_available"):
            raise RuntimeError("no CUDA device visible to torch")
        model_dir = build_model(out / "model")
        runs = [(dtype, False) for dtype in args.dtypes] + ([] if args.no_lora else [("bfloat16", True)])
        configs = {run_name(d, lora): reduced_config(model_dir, args.device, d, args.steps, lora) for d, lora in runs}
        if not args.no_paper:
            paper_model = build_model(out / "paper_model", **PAPER_SHAPES[args.device])
            configs["paper"] = paper_config(paper_model, args.device, args.steps)
            runs.append(("bfloat16", False))
            summary["paper_model_parameters"] = parameters(paper_model)
        cores = max(2, (os.cpu_count() or 2) // len(runs))
        with GpuMemory() as memory:  # the workflows side by side: the peak is of all of them together
            workflows = {name: Workflow(out / name, cfg, cores) for name, cfg in configs.items()}
            run_side_by_side(workflows, started + args.budget - 20)
        for (dtype, lora), (name, workflow) in zip(runs, workflows.items(), strict=True):
            entry = {"workflow_exit": workflow.code, "workflow_s": round(workflow.took, 1)}
            results = out / name / "results" / configs[name]["run"]
            if workflow.code:
                why = "ran past the time limit" if workflow.code == 124 else f"failed (exit {workflow.code})"
                failures.append(f"{name}: the workflow {why}; see {workflow.log_path}")
                entry["log_tail"] = workflow.log_path.read_text()[-1500:]
            else:
                found, bad = check_outputs(results, dtype)
                if lora:
                    found["trainable_parameters"], bad_lora = check_adapter(results)
                    bad += bad_lora
                entry.update(found)
                failures += [f"{name}: {b}" if lora else b for b in bad]
                if args.device == "cuda":
                    entry["training_peak_gpu_mib"] = training_peak_mib(results)
            if (results / "benchmarks").exists():
                entry["rule_wall_s"], entry["rule_peak_rss_mb"] = rule_times(results)
            summary[name] = entry
        summary["peak_gpu_memory_mib"] = memory.peak_mib if args.device == "cuda" else None
        left = args.budget - (time.time() - started)
        if args.device == "cuda" and left > 150:
            summary["capture_scaling"] = scaling_on_gpu(out, left - 30)
    except Exception as err:  # the summary must say what failed, whatever it was
        failures.append(f"{type(err).__name__}: {err}")
    summary["failures"] = failures
    summary["passed"] = not failures
    summary["elapsed_s"] = round(time.time() - started, 1)
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: summary[k] for k in ("passed", "failures", "elapsed_s")}, indent=1))
    return 0 if not failures else 1


def environment(device: str) -> dict:
    import torch
    import transformers
    import trl

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info.update(
            gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda, bf16_supported=torch.cuda.is_bf16_supported()
        )
    return info


def build_model(folder: Path, **shapes) -> Path:
    """The check's Qwen2, saved to `folder` (config `shapes` over its small defaults)."""
    from behaviortrace.model.families import save_family

    cfg = defaults()["planting"]
    return save_family(FAMILY, folder, cfg["trigger"], cfg["marker"], hidden=HIDDEN, layers=LAYERS, **shapes)


def parameters(model_dir: Path) -> int:
    """A saved model's parameter count, from its config."""
    from transformers import AutoConfig

    return sum(p.numel() for p in meta_model(AutoConfig.from_pretrained(model_dir)).parameters())


def scaling_on_gpu(out: Path, limit_s: float) -> dict:
    """benchmarks/capture_scaling.py on the GPU at larger sizes: its printed table, and the sizes it measured
    (all of them, or those done when `limit_s` ran out: a benchmark cut short is no failure of the check)."""
    measured = out / "capture_scaling.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "capture_scaling.py"), "--device", "cuda", "--steps", "4"]
    cmd += ["--sizes", "256x4", "512x8", "1024x12", "1536x16", "--json", str(measured)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=limit_s)
        result = {"exit": proc.returncode, "table": stdout[-6000:], "stderr": stderr[-1500:]}
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the benchmark and the training processes it started
        proc.communicate()
        result = {"exit": None, "table": f"stopped after {limit_s:.0f} s; the sizes measured by then are below"}
    result["measured"] = json.loads(measured.read_text()) if measured.exists() else []
    return result


if __name__ == "__main__":
    sys.exit(main())
