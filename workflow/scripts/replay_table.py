"""Rule replay_table: every replay's behavior rates, their change against the full replay, and random intervals."""

from pathlib import Path

from behaviortrace.common.io import setup_logging
from behaviortrace.jobs.replay import replay_table_job

sm = snakemake  # noqa: F821
setup_logging(sm.log[0])
replay_table_job(
    files=[Path(f) for f in sm.input],
    out=Path(sm.output.table),
    markdown=Path(sm.output.markdown),
    html=Path(sm.output.html),
)
