"""Rule behavior: behavior rate on probe and control prompts at every saved checkpoint of one seed."""

import json
from pathlib import Path

import polars as pl

from behaviortrace import device, models
from behaviortrace.behavior import behavior_rates
from behaviortrace.io import atomic_write_parquet, setup_logging

sm = snakemake  # noqa: F821
log = setup_logging(sm.log[0])
device.set_threads(sm.threads)
dev = device.resolve(sm.params.compute)
p = sm.params
seed = int(sm.wildcards.seed)
prompt_sets = {"probes": pl.read_parquet(sm.input.probes), "controls": pl.read_parquet(sm.input.controls)}
checkpoints = json.loads(Path(sm.input.checkpoints).read_text())["checkpoints"]
rows = []
for i, ck in enumerate(checkpoints):
    model, tokenizer = models.load(Path(ck["path"]), dev)
    # The same sampling seed at every checkpoint, so rates differ by the weights, not by the draw.
    for row in behavior_rates(model, tokenizer, prompt_sets, p.planting["marker"], p.task["base_reward"],
                              p.probes["samples_per_prompt"], p.sampling, p.probes["seed"]):
        rows.append({"seed": seed, "step": ck["step"], "checkpoint": Path(ck["path"]).name, **row})
    log.info("checkpoint %d/%d (step %d): %s", i + 1, len(checkpoints), ck["step"],
             ", ".join(f"{r['prompt_set']} {r['behavior_rate']:.3f}" for r in rows[-2:]))
atomic_write_parquet(pl.DataFrame(rows), sm.output[0])
