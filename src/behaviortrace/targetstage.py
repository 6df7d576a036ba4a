"""The targets stage for one (seed, draw): targets and behavior rates at every analysis checkpoint."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import zarr

from . import models
from .behavior import rates_from_samples, sample_completion_ids
from .io import atomic_write_parquet, replace_dir
from .markers import marker_token_ids
from .sketchmap import SketchMap
from .targets import target_sketches

log = logging.getLogger(__name__)
KINDS = ("in_context", "forced")


def draw_seed(targets: dict, draw: int) -> int:
    """The sampling seed of a generation draw."""
    return targets["seed"] + draw


def analysis_steps(targets: dict, saved: list[int]) -> list[int]:
    wanted = saved if targets["checkpoints"] == "all" else sorted(targets["checkpoints"])
    missing = [s for s in wanted if s not in saved]
    if missing:
        raise ValueError(f"config targets.checkpoints: steps {missing} have no saved checkpoint (saved: {saved})")
    return wanted


def build_targets(*, seed: int, draw: int, checkpoints_path: Path, probes: pl.DataFrame, controls: pl.DataFrame,
                  out_store: Path, out_rates: Path, targets: dict, sketch: dict, sampling: dict, marker: str,
                  base_reward: str, model_name: str, device: dict) -> None:
    ckpts = {c["step"]: Path(c["path"]) for c in json.loads(Path(checkpoints_path).read_text())["checkpoints"]}
    steps = analysis_steps(targets, sorted(ckpts))
    sampling_seed = draw_seed(targets, draw)
    n = targets["samples_per_prompt"]
    rows, arrays, smap = [], {f"{k}{s}": [] for k in KINDS for s in ("", "_norm", "_n")}, None
    for i, step in enumerate(steps):
        model, tokenizer = models.load(ckpts[step], device)
        if smap is None:
            smap = SketchMap.for_model(model, sketch["method"], sketch["k"], sketch["seed"])
            smap.check_covers(model)
            marker_ids = marker_token_ids(tokenizer, marker)
        rates = {}
        samples = {}
        for name, df in (("probes", probes), ("controls", controls)):
            ids = sample_completion_ids(model, tokenizer, df["prompt"].to_list(), n, sampling, sampling_seed)
            texts = [tokenizer.batch_decode(cs, skip_special_tokens=True) for cs in ids]
            samples[name] = ids
            rates[name] = rates_from_samples(texts, df["answer"].to_list(), marker, base_reward)
            rows.append({"seed": seed, "draw": draw, "sampling_seed": sampling_seed, "step": step,
                         "prompt_set": name, **rates[name]})
        prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in probes["prompt"].to_list()]
        found = target_sketches(model, tokenizer, smap, prompt_ids, samples["probes"], marker, marker_ids,
                                sampling["temperature"], sketch["chunk_rollouts"])
        for kind in KINDS:
            arrays[kind].append(found[kind]["sketch"])
            arrays[f"{kind}_norm"].append(found[kind]["norm"])
            arrays[f"{kind}_n"].append(found[kind]["n"])
        log.info("checkpoint %d/%d (step %d): probe rate %.3f, control rate %.3f, in-context target from %d samples",
                 i + 1, len(steps), step, rates["probes"]["behavior_rate"], rates["controls"]["behavior_rate"],
                 found["in_context"]["n"])
    partial = out_store.with_name(out_store.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    group = zarr.open_group(partial, mode="w")
    group.create_array("checkpoint_step", data=np.array(steps, dtype="int64"))
    for name, values in arrays.items():
        group.create_array(name, data=np.asarray(values, dtype="float32" if name in KINDS else None))
    group.attrs.update({**smap.attrs(), "model": model_name, "draw": draw, "sampling_seed": sampling_seed,
                        "complete": True})
    atomic_write_parquet(pl.DataFrame(rows), out_rates)
    replace_dir(partial, out_store)


def headroom_table(rate_files: list[Path], saturation: float) -> pl.DataFrame:
    """Probe and control behavior rate per seed, draw and checkpoint, with headroom and a saturation flag."""
    rates = pl.concat([pl.read_parquet(p) for p in rate_files])
    wide = rates.pivot(on="prompt_set", index=["seed", "draw", "step"], values="behavior_rate")
    return (wide.rename({"probes": "probe_rate", "controls": "control_rate"})
            .with_columns(headroom=1 - pl.col("probe_rate"), saturated=pl.col("probe_rate") >= saturation)
            .sort("seed", "draw", "step"))


def headroom_markdown(table: pl.DataFrame, saturation: float) -> str:
    lines = [f"# Headroom: behavior rate on probes (and controls) per checkpoint; saturated at >= {saturation}", "",
             "| seed | draw | step | probe rate | control rate | headroom | saturated |", "|---|---|---|---|---|---|---|"]
    for r in table.iter_rows(named=True):
        lines.append(f"| {r['seed']} | {r['draw']} | {r['step']} | {r['probe_rate']:.3f} | {r['control_rate']:.3f} "
                     f"| {r['headroom']:.3f} | {'yes' if r['saturated'] else 'no'} |")
    return "\n".join(lines) + "\n"
