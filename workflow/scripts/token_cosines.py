"""Rule token_cosines: behavior-token and null-position cosines with the targets, for one seed and draw."""

from pathlib import Path

from behaviortrace.common.io import setup_logging
from behaviortrace.jobs.evaluate import token_cosines_job

sm = snakemake  # noqa: F821
setup_logging(sm.log[0])
token_cosines_job(
    draw=int(sm.wildcards.draw),
    shards=[Path(p) for p in sm.input.shards],
    rollouts=Path(sm.input.rollouts),
    target_store=Path(sm.input.target),
    out=Path(sm.output[0]),
)
