"""Reduced workflows on a model folder, run by Snakemake side by side in the background, and the model shapes the
GPU check and the cost plan scale to (diagnostics/gpu_check.py, benchmarks/cost_plan.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import yaml

from behaviortrace.config.load import defaults
from behaviortrace.tools.checkout import checkout

# Qwen2.5-1.5B-Instruct's shapes (its config.json), the paper's model.
PAPER_MODEL = {
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}


PAPER_SETTINGS = {
    "grpo": ("adam_epsilon", "max_grad_norm", "lr_scheduler", "warmup_steps"),
    "influence": ("measure_at", "lds_percents", "leave_step_out", "fd_rollouts"),
}


LORA = {"rank": 8, "alpha": 16.0, "target_modules": ["q_proj", "v_proj"]}


def reduced_config(model_dir: Path, device: str, dtype: str, steps: int, lora: bool = False) -> dict:
    """The default config, reduced to a workflow of a few minutes, with the given model, device and dtype (and
    LoRA adapters instead of every weight, with `lora`)."""
    from behaviortrace.sketch.tolerance import tolerance_for

    cfg = defaults()
    cfg.update(run=f"gpu_check_{run_name(dtype, lora)}", seeds=[0])
    # The paper's optimizer and influence settings (config/paper.yaml), which the cost plan extrapolates.
    paper = yaml.safe_load((checkout() / "config" / "paper.yaml").read_text())
    for section, names in PAPER_SETTINGS.items():
        cfg[section].update({name: paper[section][name] for name in names})
    cfg["compute"] = {"device": device, "dtype": dtype}
    cfg["model"]["name"] = str(model_dir)
    cfg["model"]["sft"].update(steps=4, batch_size=8)
    cfg["task"]["prompt_format"] = "auto"
    cfg["probes"].update(n_probes=16, n_plain=16, samples_per_prompt=2)
    cfg["grpo"].update(steps=steps, prompts_per_step=4, num_generations=4, max_new_tokens=16, save_every=steps // 2)
    cfg["planting"].update(window=[0, steps // 2 - 1], explore=2)
    cfg["sketch"].update(mode="train", method="countsketch", k=65536, shard_steps=steps // 2, chunk_rollouts=16)
    cfg["targets"].update(draws=1, samples_per_prompt=2)
    cfg["estimators"] = {name: cfg["estimators"][name] for name in ("tracincp", "gas", "norm", "fluency", "random")}
    cfg["evaluation"]["bootstrap"] = 50
    cfg["replay"].update(estimators=["gas"], random_repeats=1, measure_at=["window_end"])
    cfg["influence"].update(sets=["gas"], lds_subsets=3)  # the exact influence too, with the smallest LDS
    cfg["placebo"]["enabled"] = False
    cfg["checklist"]["max_self_check_error"] = tolerance_for(dtype)
    if lora:
        cfg["model"]["lora"] = dict(LORA)
    return cfg


def run_name(dtype: str, lora: bool) -> str:
    return f"{dtype}_lora" if lora else dtype


class Workflow:
    """Snakemake on a reduced config in a folder of its own, in the background (its output in snakemake.log)."""

    def __init__(self, work: Path, cfg: dict, cores: int):
        work.mkdir(parents=True, exist_ok=True)
        (work / "config.yaml").write_text(yaml.safe_dump(cfg))
        cmd = [sys.executable, "-m", "snakemake", "-s", str(checkout() / "Snakefile"), "--directory", str(work)]
        cmd += ["--configfile", str(work / "config.yaml"), "--cores", str(cores)]
        self.log_path = work / "snakemake.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 (closed in `stop`)
        self.started, self.took, self.code = time.time(), None, None
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, text=True)

    def poll(self) -> bool:
        """Whether it has ended (its exit code and time recorded)."""
        if self.code is None and self.proc.poll() is not None:
            self.code, self.took = self.proc.returncode, time.time() - self.started
            self._log.close()
        return self.code is not None

    def stop(self) -> None:
        """Stop it (past the time limit): exit code 124."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.code, self.took = 124, time.time() - self.started
        self._log.close()


def run_side_by_side(workflows: dict[str, Workflow], deadline: float) -> None:
    """Wait for every workflow, stopping those still running at `deadline`."""
    while not all(w.poll() for w in workflows.values()):
        if time.time() > deadline:
            for w in workflows.values():
                if not w.poll():
                    w.stop()
            return
        time.sleep(1)
