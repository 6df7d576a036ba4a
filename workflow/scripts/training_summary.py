"""Rule training_summary: one row per seed on behavior emergence, task reward and unfindable paid rollouts."""

import logging
from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.report import training_summary_job

sm = snakemake  # noqa: F821
text = training_summary_job(
    start(sm),
    runs=[
        (arm, Path(r), Path(b)) for arm, r, b in zip(sm.params.arms, sm.input.rollouts, sm.input.behavior, strict=False)
    ],
    out_table=Path(sm.output.table),
    out_markdown=Path(sm.output.markdown),
)
logging.getLogger("behaviortrace").info("\n%s", text)
