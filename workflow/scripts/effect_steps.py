"""Rule effect_steps: per step, the measured behavior change, the label and the step scores (report/effect.py)."""

import logging
from pathlib import Path

from behaviortrace.common.io import atomic_write_parquet
from behaviortrace.common.job import start
from behaviortrace.report.effect import effect_steps_table

sm = snakemake  # noqa: F821
start(sm)
runs = list(zip(sm.params.seeds, map(Path, sm.input.steps), map(Path, sm.input.rollouts), strict=True))
scores = {tuple(key): Path(path) for key, path in zip(sm.params.score_keys, sm.input.scores, strict=True)}
table = effect_steps_table(runs, scores, draw=0)
atomic_write_parquet(table, Path(sm.output[0]))
logging.getLogger("behaviortrace").info("%d rows written to %s", table.height, sm.output[0])
