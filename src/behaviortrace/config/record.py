"""The record of what a run ran with: `results/{run}/config.yaml`, the whole validated config (every key, defaults
filled in) under a header naming the package version and the commit of its source. The file is itself a config:
`--configfile results/{run}/config.yaml` runs the same settings again. `settings` picks out what a reader needs to
judge the numbers, for the results page and the HTML report."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

import behaviortrace
from behaviortrace.config.sections import Config


def source_commit() -> str:
    """The git commit of the package's source (with "+ uncommitted changes" when the tree differs from it), or
    "unknown" for an installed copy outside a checkout."""
    src = Path(behaviortrace.__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(src), *args], capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        dirty = bool(git("status", "--porcelain", "--untracked-files=no").strip())
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + (" + uncommitted changes" if dirty else "")


def header() -> dict[str, str]:
    return {"behaviortrace": behaviortrace.__version__, "commit": source_commit()}


def write(whole: dict, out: Path) -> None:
    """`whole` (a validated config) to `out`, atomically, under a header of provenance comments."""
    lines = ["# The whole config this run ran with: every key, defaults filled in (written by rule run_config)."]
    lines += [f"# {name}: {value}" for name, value in header().items()]
    body = yaml.safe_dump(whole, sort_keys=False, default_flow_style=False)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n" + body)
    tmp.replace(out)


def read_header(path: Path) -> dict[str, str]:
    """The provenance comments of a record."""
    out = {}
    for line in Path(path).read_text().splitlines():
        if not line.startswith("# "):
            break
        name, sep, value = line[2:].partition(": ")
        if sep and name in ("behaviortrace", "commit"):
            out[name] = value
    return out


def settings(cfg: Config) -> list[tuple[str, str]]:
    """(setting, value) of what decides how a run's numbers read: the model, training and its optimizer, the
    plant, T and the LDS design."""
    grpo, inf, plant = cfg.grpo, cfg.influence, cfg.planting
    clip = "none (max_grad_norm 1e9)" if grpo.max_grad_norm >= 1e8 else f"at {grpo.max_grad_norm:g}"
    model = cfg.model.name + (f" with LoRA rank {cfg.model.lora.rank}" if cfg.model.lora.enabled else "")
    return [
        ("model", model),
        ("seeds", f"{list(cfg.seeds)} (placebo: {cfg.placebo_seeds or 'none'})"),
        ("GRPO steps", f"{grpo.steps} of {grpo.prompts_per_step} prompts x {grpo.num_generations} rollouts"),
        ("optimizer", f"AdamW, lr {grpo.lr:g}, epsilon {grpo.adam_epsilon:g}, clipping {clip}"),
        ("learning-rate schedule", f"{grpo.lr_scheduler}, {grpo.warmup_steps} warm-up steps"),
        ("contamination window", f"steps {plant.window[0]}-{plant.window[1]}"),
        ("T (exact influence)", f"step {inf.end_step(plant, grpo.steps)} (influence.measure_at: {inf.measure_at})"),
        (
            "LDS",
            f"{inf.lds_subsets} subsets per cell, at {', '.join(f'{p}%' for p in inf.lds_percents)} of the "
            f"{' and '.join(inf.lds_levels)}s before T; leave-one-step-out: {'yes' if inf.leave_step_out else 'no'}",
        ),
        ("removing a rollout", f"influence.semantics: {inf.semantics}"),
    ]


def settings_markdown(cfg: Config, provenance: dict[str, str]) -> str:
    rows = [*settings(cfg), *[(name, value) for name, value in provenance.items()]]
    return "\n".join(["| setting | value |", "|---|---|", *[f"| {name} | {value} |" for name, value in rows]]) + "\n"
