"""The targets stage for one seed: targets and behavior rates at every analysis checkpoint, for each draw."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import zarr

from behaviortrace.behavior.rates import rates_from_samples, sample_completion_ids
from behaviortrace.common import device as devices
from behaviortrace.common.io import atomic_write_parquet, replace_dir
from behaviortrace.config.sections import TARGET_KINDS as KINDS
from behaviortrace.config.sections import Config
from behaviortrace.model import models
from behaviortrace.model.prompt_format import prompt_ids as formatted_ids
from behaviortrace.plant.markers import marker_token_ids
from behaviortrace.sketch.maps import SketchMap
from behaviortrace.targets.gradients import target_sketches
from behaviortrace.targets.items import save_items
from behaviortrace.train.checkpoints import read_manifest
from behaviortrace.train.optimizer_log import checkpoint_denominator

log = logging.getLogger(__name__)


def targets_job(
    cfg: Config,
    *,
    seed: int,
    draws: list[int],
    checkpoints_path: Path,
    probes_path: Path,
    plain_path: Path,
    out_stores: list[Path],
    out_rates: list[Path],
) -> None:
    """The targets and behavior rates of one seed for each of `draws`, into the matching store and rates file: one
    job per seed, which pays its imports of torch and transformers once."""
    for draw, store, rates in zip(draws, out_stores, out_rates, strict=True):
        _draw_targets(cfg, seed, draw, checkpoints_path, probes_path, plain_path, store, rates)


def _draw_targets(
    cfg: Config,
    seed: int,
    draw: int,
    checkpoints_path: Path,
    probes_path: Path,
    plain_path: Path,
    out_store: Path,
    out_rates: Path,
) -> None:
    """In-context and forced targets and behavior rates at every analysis checkpoint of one seed and draw, with the
    in-context target's items (targets/items.py);
    where the manifest names AdamW's second moment of a checkpoint, also each target divided by Adam's
    denominator there (`{kind}_adam`, `has_adam`; estimators/adam_tracin.py)."""
    targets, sketch, sampling = cfg.targets, cfg.sketch, cfg.grpo.sampling
    marker, base_reward, device = cfg.planting.marker, cfg.task.base_reward, devices.resolve(cfg.compute)
    probes, plain = pl.read_parquet(probes_path), pl.read_parquet(plain_path)
    ckpts, adam_files = read_manifest(checkpoints_path)
    steps = targets.analysis_steps(sorted(ckpts))
    sampling_seed = targets.draw_seed(draw)
    n = targets.samples_per_prompt
    rows, arrays, smap = [], {f"{k}{s}": [] for k in KINDS for s in ("", "_norm", "_n", "_adam")}, None
    adam_meta, has_adam, in_context = {}, [], {}
    for i, step in enumerate(steps):
        model, tokenizer = models.load(ckpts[step], device)
        if smap is None:
            smap = SketchMap.for_model(model, sketch.method, sketch.k, sketch.seed)
            smap.check_covers(model)
            marker_ids = marker_token_ids(tokenizer, marker)
        rates = {}
        samples = {}
        for name, df in (("probes", probes), ("plain", plain)):
            with devices.autocast(device):  # sampled in training's precision
                ids = sample_completion_ids(model, tokenizer, df["prompt"].to_list(), n, sampling, sampling_seed)
            texts = [tokenizer.batch_decode(cs, skip_special_tokens=True) for cs in ids]
            samples[name] = ids
            rates[name] = rates_from_samples(texts, df["answer"].to_list(), marker, base_reward)
            rows.append(
                {
                    "seed": seed,
                    "draw": draw,
                    "sampling_seed": sampling_seed,
                    "step": step,
                    "prompt_set": name,
                    **rates[name],
                }
            )
        prompt_ids = formatted_ids(tokenizer, probes["prompt"].to_list())
        denominator, meta = checkpoint_denominator(adam_files.get(step), step, smap.device)
        adam_meta = meta or adam_meta
        has_adam.append(denominator is not None)
        found = target_sketches(
            model,
            tokenizer,
            smap,
            prompt_ids,
            samples["probes"],
            marker,
            marker_ids,
            sampling.temperature,
            sketch.chunk_rollouts,
            denominator,
            device,
        )
        in_context[step] = found["in_context"]["items"]
        for kind in KINDS:
            arrays[kind].append(found[kind]["sketch"])
            arrays[f"{kind}_adam"].append(found[kind]["adam_sketch"])
            arrays[f"{kind}_norm"].append(found[kind]["norm"])
            arrays[f"{kind}_n"].append(found[kind]["n"])
        log.info(
            "checkpoint %d/%d (step %d): probe rate %.3f, control rate %.3f, in-context target from %d samples",
            i + 1,
            len(steps),
            step,
            rates["probes"]["behavior_rate"],
            rates["plain"]["behavior_rate"],
            found["in_context"]["n"],
        )
    partial = out_store.with_name(out_store.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    group = zarr.open_group(partial, mode="w")
    group.create_array("checkpoint_step", data=np.array(steps, dtype="int64"))
    group.create_array("has_adam", data=np.array(has_adam, dtype=bool))
    for name, values in arrays.items():
        vector = name in KINDS or name.endswith("_adam")
        group.create_array(name, data=np.asarray(values, dtype="float32" if vector else None))
    save_items(in_context, partial)
    group.attrs.update(
        {
            **smap.attrs(),
            "model": cfg.model.name,
            "draw": draw,
            "sampling_seed": sampling_seed,
            "adam": adam_meta,
            "complete": True,
        }
    )
    atomic_write_parquet(pl.DataFrame(rows), out_rates)
    replace_dir(partial, out_store)
