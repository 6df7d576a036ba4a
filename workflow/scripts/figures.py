"""Rule figures: the run's PNG figures from the aggregated metrics and the behavior rates."""

import logging
from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.report import figures_job

sm = snakemake  # noqa: F821
figures_job(
    start(sm),
    metrics=Path(sm.input.metrics),
    behavior=[(arm, Path(p)) for arm, p in zip(sm.params.arms, sm.input.behavior, strict=False)],
    replay=Path(sm.input.replay),
    effect_steps=Path(sm.input.effect_steps),
    outputs={k: Path(v) for k, v in sm.output.items()},
)
logging.getLogger("behaviortrace").info("%d figures written", len(sm.output))
