"""Rule headroom: behavior rates on probes and controls per seed, draw and analysis checkpoint."""

import logging
from pathlib import Path

from behaviortrace.common.job import start
from behaviortrace.jobs.report import headroom_job

sm = snakemake  # noqa: F821
table = headroom_job(
    start(sm),
    rate_files=[Path(p) for p in sm.input],
    out_table=Path(sm.output.table),
    out_markdown=Path(sm.output.markdown),
)
logging.getLogger("behaviortrace").info("%d rows; %d saturated", table.height, int(table["saturated"].sum()))
