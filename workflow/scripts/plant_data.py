"""Rule plant_data: training prompts in training order; held-out probe and control prompts."""

from behaviortrace.data import plant_prompts
from behaviortrace.io import atomic_write_parquet, setup_logging

sm = snakemake  # noqa: F821
log = setup_logging(sm.log[0])
p = sm.params
tables = plant_prompts(p.task, p.planting, p.schedule, p.probes, p.probes["seed"])
for name, key in (("train", "train"), ("probes", "probes"), ("controls", "controls")):
    atomic_write_parquet(tables[key], sm.output[name])
    log.info("%s: %d prompts (%d with trigger)", name, tables[key].height, int(tables[key]["trigger"].sum()))
